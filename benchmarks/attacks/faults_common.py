"""What the parts of ``benchmarks/attacks/bench_faults.py`` share beyond ``benchmarks/harness.py`` (the
daemon, the CLI, waits and scratch folders, re-exported here): tallies, the flipping trace, and the toy
and torch job files (imported by bench_faults.py and its parts, which import nothing from
bench_faults.py itself)."""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/, for the shared harness

from harness import NOBODY, PY, ROOT, Daemon, cli, wait, workdir  # noqa: E402

__all__ = ["NOBODY", "PY", "ROOT", "Daemon", "cli", "wait", "workdir"]  # what the parts import from here


# ---------------------------------------------------------------- tallies
@dataclass
class Tally:
    kills: int = 0
    lost: int = 0
    duplicated: int = 0
    recalls: int = 0
    orphans: int = 0
    fuzz: int = 0
    tracebacks: int = 0
    spoofed: int = 0
    accepted: int = 0
    notes: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.notes.append(what)
        print(f"  ! {what}", flush=True)


def stop_and_count(d: Daemon, t: Tally) -> None:
    """Stop ``d`` and add to ``t`` what it left: a traceback in its log or a non-zero exit, and any
    process of its still running."""
    rc = d.stop()
    t.tracebacks += d.log_tracebacks() + (rc != 0)
    t.orphans += d.orphans()


def flip_trace(path: Path, nodes: int, changes: int, span_s: float, rng: random.Random,
               min_idle: int = 1) -> int:
    """A nodes-csv trace: all ``nodes`` idle, then ``changes`` state flips over ``span_s`` seconds,
    never fewer than ``min_idle`` idle; returns the number of recalls (idle -> busy) in it."""
    t0 = 1_700_000_000
    names = [f"n{i:02d}" for i in range(nodes)]
    idle = {n: True for n in names}
    rows = [f"{t0},{n},1" for n in names]
    recalls = 0
    for k in range(changes):
        t = t0 + 1 + int((k + 1) * span_s / changes)
        busy_ok = [n for n in names if idle[n]] if sum(idle.values()) > min_idle else []
        back = [n for n in names if not idle[n]]
        if busy_ok and (not back or rng.random() < 0.5):
            n = rng.choice(busy_ok)
            idle[n] = False
            recalls += 1
        else:
            n = rng.choice(back)
            idle[n] = True
        rows.append(f"{t},{n},{int(idle[n])}")
    end = t0 + 2 + int(span_s)
    rows += [f"{end},{n},1" for n in names if not idle[n]]  # afterwards every node is idle again
    path.write_text("time,node,idle\n" + "\n".join(rows) + "\n")
    return recalls


# ---------------------------------------------------------------- kills
TOY_CONFIG = """
state_dir = "{{state}}"
runtime = "toy"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 4.0
backend = "local"
[local]
nodes = 4
trace = "{trace}"
time_scale = 1.0
[policy]
profiling = "requested"
"""

TOY_JOB = """
name = "{name}"
command = ["python", "-m", "malletrain.worker.toy", "--rate", "{rate}"]
min_nodes = {lo}
max_nodes = {hi}
profile = {profile}
{samples}
"""


TORCH_CONFIG = """
state_dir = "{{state}}"
runtime = "torch"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 6.0
backend = "local"
[local]
nodes = {nodes}
trace = "{trace}"
time_scale = 1.0
[policy]
max_running = {max_running}
"""

TORCH_JOB = """
name = "{name}"
command = ["python", "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
           "--step-sleep", "0.02"]
min_nodes = {lo}
max_nodes = {hi}
profile = {profile}
env = {{ OMP_NUM_THREADS = "1" }}
"""


def trains(d: Daemon, jid: str, timeout: float) -> bool:
    """The job's stored progress grows within ``timeout``."""
    start = d.jobs()[jid]["samples"]
    return bool(wait(lambda: d.jobs()[jid]["samples"] > start, timeout, 0.5))


def submit_file(d: Daemon, name: str, text: str, as_nobody: bool = False) -> str:
    """Submit ``text`` through the CLI from a job file readable by all, as the ``nobody`` user with
    ``as_nobody``; the new job's id."""
    f = d.top / f"{name}.toml"
    f.write_text(text)
    os.chmod(f, 0o644)
    res = cli("submit", str(f), "--state-dir", str(d.state), as_nobody=as_nobody)
    if res.returncode != 0:
        raise RuntimeError(f"submit {name} failed: {res.stderr[-500:]}")
    return res.stdout.strip()
