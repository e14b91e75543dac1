"""Process checks shared by the real-process tests (no orphans left behind)."""

from __future__ import annotations

from malletrain.cli.procs import procs_mentioning

__all__ = ["procs_mentioning"]
