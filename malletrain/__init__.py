"""malletrain: elastic deep-learning training on a supercomputer's idle nodes."""

__version__ = "0.1.0"
