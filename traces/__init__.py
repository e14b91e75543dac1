"""Read scheduler logs into idle-node timelines; synthetic traces fitted to real ones."""

from traces.model import EventBatch, IdleTimeline, NodeEvent, TraceError

__all__ = ["EventBatch", "IdleTimeline", "NodeEvent", "TraceError"]
