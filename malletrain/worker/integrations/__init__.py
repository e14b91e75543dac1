"""Callbacks for training frameworks: exact progress reports and a checkpoint on notice of a recall.

- :mod:`malletrain.worker.integrations.lightning`: :class:`~malletrain.worker.integrations.lightning.MalletrainCallback`
  for PyTorch Lightning (extra ``[lightning]``);
- :mod:`malletrain.worker.integrations.huggingface`: :class:`~malletrain.worker.integrations.huggingface.MalletrainCallback`
  for the Hugging Face ``Trainer`` (extra ``[huggingface]``);
- :mod:`malletrain.worker.integrations.recall`: what both share (the SIGTERM notice, the per-step agreement of
  all ranks on samples and on stopping), without either framework.

Importing this package imports neither framework.
"""
