"""Process checks shared by the real-process tests (no orphans left behind)."""

from __future__ import annotations

import os

import psutil


def procs_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line or environment mentions ``text`` (the state dir)."""
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
