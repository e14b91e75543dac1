"""Which live processes belong to a run: the demo's, the benchmarks' and the tests' orphan check."""

from __future__ import annotations

import os

import psutil


def procs_mentioning(text: str) -> list[psutil.Process]:
    """Live processes (not zombies, not this one) whose command line or environment mentions
    ``text`` (a state dir: every agent and worker a daemon starts carries it)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            if any(text in part for part in (p.info["cmdline"] or [])) or text in str(p.environ()):
                out.append(p)
        except psutil.Error:
            pass
    return out
