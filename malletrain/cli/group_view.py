"""Arrays and sweeps as people read them (pure formatting): one line per array in ``malletrain
status``, one per sweep, and a sweep's trials for ``malletrain sweep show``."""

from __future__ import annotations

from typing import Any

from malletrain.cli.status_view import printable, text_table

STATE_ORDER = ("running", "rescaling", "profiling", "pending", "suspended", "completed", "failed", "cancelled")


def indices_text(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out: list[str] = []
    nums = sorted(i for i in indices if i is not None)
    start = prev = None
    for i in nums + [None]:
        if start is not None and (i is None or i != prev + 1):  # type: ignore[operator]
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ",".join(out)


def counts_text(counts: dict[str, int]) -> str:
    """``{"running": 2, "completed": 5}`` -> ``2 running, 5 completed`` (in life order)."""
    keys = sorted(counts, key=lambda s: STATE_ORDER.index(s) if s in STATE_ORDER else len(STATE_ORDER))
    return ", ".join(f"{counts[k]} {printable(k)}" for k in keys)


def format_arrays(rows: list[dict[str, Any]]) -> str:
    """The arrays table (one line an array, its counts by state)."""
    table = [("ARRAY", "NAME", "INDICES", "ELEMENTS", "NODES", "STATES")]
    for r in rows:
        table.append((printable(r["array"]), printable(r["name"], 24), indices_text(r["indices"]),
                      str(r["elements"]), str(r["nodes"]), counts_text(r["counts"])))
    return text_table(table)


def format_sweeps(rows: list[dict[str, Any]]) -> str:
    """The sweeps table (one line a sweep: trials ended of wanted, the best value)."""
    table = [("SWEEP", "DIRECTION", "TRIALS", "STATES", "BEST")]
    for s in rows:
        if s.get("error") and not s.get("trials"):
            table.append((printable(s["name"]), "-", "-", f"error: {printable(s['error'], 60)}", "-"))
            continue
        counts: dict[str, int] = {}
        for t in s["trials"]:
            counts[t["state"]] = counts.get(t["state"], 0) + 1
        best = s.get("best")
        table.append((printable(s["name"]), s["direction"], f"{s['trials_ended']}/{s['trials_wanted']}",
                      counts_text(counts) or "-",
                      f"{best['value']:.6g} (trial {best['number']})" if best else "-"))
    return text_table(table)


def format_sweep(s: dict[str, Any]) -> str:
    """One sweep's trials (number, values, state, value, job) and its best trial."""
    names = sorted({k for t in s["trials"] for k in t["values"]})
    table = [("TRIAL", *(n.upper() for n in names), "STATE", "VALUE", "JOB", "REASON")]
    for t in s["trials"]:
        table.append((str(t["number"]), *(_value(t["values"].get(n)) for n in names), printable(t["state"]),
                      "-" if t["value"] is None else f"{t['value']:.6g}", printable(t.get("job") or "-"),
                      printable(t.get("reason") or "", 60)))
    head = (f"sweep {printable(s['name'])}: {s['direction']}, {s['trials_ended']} of {s['trials_wanted']} trials "
            f"ended, sampler {s['sampler']}, pruner {s['pruner']}" + (", cancelled" if s.get("cancelled") else ""))
    best = s.get("best")
    tail = (f"best: trial {best['number']}, value {best['value']:.6g}, "
            + ", ".join(f"{k}={_value(v)}" for k, v in sorted(best["values"].items()))) if best else "best: none yet"
    return "\n".join([head, text_table(table), tail])


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return printable("-" if v is None else v, 24)
