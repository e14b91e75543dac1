"""Callbacks for training frameworks: exact progress reports and a checkpoint on notice of a recall.

- :mod:`malletrain.integrations.lightning`: :class:`~malletrain.integrations.lightning.MalletrainCallback`
  for PyTorch Lightning (extra ``[lightning]``);
- :mod:`malletrain.integrations.huggingface`: :class:`~malletrain.integrations.huggingface.MalletrainCallback`
  for the Hugging Face ``Trainer`` (extra ``[huggingface]``);
- :mod:`malletrain.integrations.recall`: what both share (the SIGTERM notice, the per-step agreement of
  all ranks on samples and on stopping), without either framework.

Importing this package imports neither framework.
"""
