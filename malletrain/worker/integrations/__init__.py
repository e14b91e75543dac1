"""Callbacks for training frameworks (``lightning``, ``huggingface``; ``recall``: what both share): exact
progress reports and a checkpoint on notice of a recall. Importing this package imports neither framework."""
