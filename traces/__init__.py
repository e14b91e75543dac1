"""Read scheduler logs into idle-node timelines; synthetic traces fitted to real ones.

``read(path)`` detects the format (one of ``FORMATS``) from the content.
Submodules: ``data`` (find the real logs), ``stats``, ``plots``, ``synthetic``
(``summit_like()``, the embedded SYNTHETIC week) and ``bursts`` (its group model).
Bad input is always a ``TraceError`` naming file and line (limits in ``_text``).
"""

from traces.model import EventBatch, IdleTimeline, NodeEvent, TraceError
from traces.readers import FORMATS, detect_format, read

__all__ = ["EventBatch", "FORMATS", "IdleTimeline", "NodeEvent", "TraceError", "detect_format", "read"]
