"""Tiny CPU training scripts for the ``torch`` runtime (synthetic data, no downloads).

Run one with ``python -m malletrain.worker.examples.train --model mlp|cnn|linear``.
"""
