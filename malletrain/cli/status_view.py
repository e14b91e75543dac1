"""Status as people read it: the job and node tables of ``malletrain status``, each failed or
suspended job's reason and log tail (pure formatting; ``malletrain.cli.daemon`` and
``malletrain.cli.demo`` both use it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

LOG_DIR = "logs"  # STATE_DIR/logs: the agents write WORKER.log there (worker ids start with the job id)

TAIL_LINES = 5
TAIL_BYTES = 4096


def job_logs(state: Path, jid: str) -> list[Path]:
    """The job's log files, oldest first: one per worker (``logs/JOBID.*.log``), and a Horovod driver's."""
    if not jid.isalnum():
        return []  # job ids are jNNNNNN; never glob with anything else
    found = list((state / LOG_DIR).glob(f"{jid}.*.log")) + list((state / "horovod").glob(f"{jid}-*/driver.log"))

    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=lambda p: (mtime(p), str(p)))


def job_note(j: dict[str, Any]) -> str | None:
    """One line on why a job is where it is, when that is worth saying (a queued job: why it waits)."""
    state, message = j.get("state"), j.get("message") or ""
    target, samples = j.get("target"), int(j.get("samples") or 0)
    if state == "completed" and target and samples < int(target):
        return f"the command exited 0 at {samples:,} of {int(target):,} samples ({message or 'no reason stored'})"
    waiting = j.get("waiting") or ""
    if j.get("stalled") and state in ("running", "rescaling", "profiling"):
        return str(j["stalled"])
    if state in ("pending", "suspended") and waiting:
        return f"{message}; waiting: {waiting}" if state == "suspended" and message else f"waiting: {waiting}"
    if state in ("failed", "suspended") and message:
        return message
    return None


def tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The last non-empty lines of a log (reads at most ``max_bytes``); [] if it cannot be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read(max_bytes)
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    return [ln for ln in text.splitlines() if ln.strip()][-lines:]


def printable(text: Any, limit: int | None = None) -> str:
    """``text`` with control and other non-printable characters escaped (``\\n``, ``\\x1b``)."""
    out = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(text))
    return out if limit is None or len(out) <= limit else out[: limit - 1] + "~"


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    """The job table: TRAINER ("-": unknown without the daemon), STATE (``stalled``: no progress, its note
    says how long), and BUDGET (used / budget) and DEADLINE (UTC) when some job has one."""
    budgets = any(j.get("budget_node_hours") is not None for j in jobs)
    deadlines = any(j.get("deadline") is not None for j in jobs)
    head = ("JOBID", "NAME", "TRAINER", "STATE", "NODES", "MIN-MAX", "SAMPLES", "TARGET", "RATE/S")
    rows = [head + ("BUDGET-NH",) * budgets + ("DEADLINE",) * deadlines + ("NODELIST",)]
    for j in jobs:
        rate = j.get("rate")
        row = (
            printable(j["id"]), printable(j["name"], 16), printable(j.get("trainer") or "-", 16),
            printable("stalled" if j.get("stalled") else j["state"]), str(len(j["nodes"])),
            f"{j['min_nodes']}-{j['max_nodes']}", str(j["samples"]),
            str(j["target"] or "-"), f"{rate:.1f}" if rate else "-",
        )
        row += (budget_text(j),) * budgets + (deadline_text(j.get("deadline")),) * deadlines
        rows.append(row + (printable(",".join(j["nodes"])) or "-",))
    return text_table(rows)


def budget_text(job: dict[str, Any]) -> str:
    """``used/budget`` node-hours (``-``: no budget; ``?/budget``: use not known here)."""
    budget = job.get("budget_node_hours")
    if budget is None:
        return "-"
    used = job.get("used_node_hours")
    return f"{'?' if used is None else f'{float(used):.3g}'}/{float(budget):.4g}"


def deadline_text(deadline: Any) -> str:
    """A deadline (unix seconds) as ``YYYY-MM-DD HH:MMZ`` (UTC); ``-``: none."""
    import datetime as dt

    if deadline is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(float(deadline), dt.timezone.utc).strftime("%Y-%m-%d %H:%MZ")
    except (ValueError, OverflowError, OSError):
        return printable(deadline, 24)


def format_details(jobs: list[dict[str, Any]], log_dir: str) -> str:
    """Under the table: each job's note, its log files, and the last lines of a failed job's newest log."""
    lines: list[str] = []
    for j in jobs:
        note = j.get("note")
        logs = j.get("logs") or []
        if not note:
            continue
        lines.append(f"{printable(j['id'])} {printable(j['state'])}: {printable(note)}")
        if logs:
            more = f" (newest of {len(logs)})" if len(logs) > 1 else ""
            lines.append(f"  log: {printable(logs[-1])}{more}")
            if j.get("state") == "failed":
                lines.extend(f"    | {printable(ln, 200)}" for ln in tail(Path(logs[-1])))
        elif j.get("state") != "pending":  # a queued job has run nowhere yet
            lines.append(f"  log: none in {printable(log_dir)}")
    lines.append(f"worker logs: {printable(log_dir)}/JOBID.*.log")
    return "\n".join(lines)


def format_notes(jobs: list[dict[str, Any]]) -> str:
    """One line a job that has a note (why it waits, why it is stalled, why it failed): what ``status``
    prints under its table, without the log paths (the demo's live table)."""
    return "\n".join(f"{printable(j['id'])} {printable(j['state'])}: {printable(note)}"
                     for j in jobs if (note := job_note(j)))


def format_nodes(nodes: list[dict[str, Any]]) -> str:
    """The node table; TRAINER is the trainer the node belongs to ("-": none takes it)."""
    return text_table([("NODE", "STATE", "TRAINER", "JOB")]
                  + [(printable(n["node"]), printable(n["state"]), printable(n.get("trainer") or "-"),
                      printable(n["job"] or "-")) for n in nodes])


def text_table(rows: list[tuple[str, ...]]) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
