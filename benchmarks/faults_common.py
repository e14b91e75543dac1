"""What the parts of ``benchmarks/bench_faults.py`` share: a real daemon in a scratch dir, the CLI,
waits, tallies, and the toy and torch job files (imported by bench_faults.py and its parts, which
import nothing from bench_faults.py itself)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil

from malletrain.cli.procs import procs_mentioning

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
NOBODY = 65534


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


# ---------------------------------------------------------------- helpers
def cli(*args: str, timeout: float = 60, as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [PY, "-m", "malletrain", *args]
    if as_nobody:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


def wait(pred: Callable[[], Any], timeout: float, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    return None


class Daemon:
    """One ``malletrain daemon`` subprocess on ``state`` with ``config`` (TOML text)."""

    def __init__(self, top: Path, config: str) -> None:
        self.top = top
        self.state = top / "state"
        self.cfg = top / "daemon.toml"
        self.cfg.write_text(config.format(state=self.state))
        self.log = top / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        (self.state / "daemon.json").unlink(missing_ok=True)
        self.proc = subprocess.Popen([PY, "-m", "malletrain", "daemon", "--config", str(self.cfg)],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd="/")
        if not wait(lambda: (self.state / "daemon.json").exists() or self.proc.poll() is not None, 60):
            raise RuntimeError(f"daemon did not start; see {self.log}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log.read_text()[-1500:]}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any]:
        res = cli("status", "--json", "--state-dir", str(self.state))
        if res.returncode != 0:
            raise RuntimeError(f"status failed: {res.stderr[-500:]}")
        return json.loads(res.stdout)

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {j["id"]: j for j in self.status()["jobs"]}

    def submit(self, text: str, name: str) -> str:
        f = self.top / f"{name}.toml"
        f.write_text(text)
        os.chmod(f, 0o644)
        res = cli("submit", str(f), "--state-dir", str(self.state))
        if res.returncode != 0:
            raise RuntimeError(f"submit {name} failed: {res.stderr[-500:]}")
        return res.stdout.strip()

    def cancel(self, jid: str) -> None:
        cli("cancel", jid, "--state-dir", str(self.state))

    def log_tracebacks(self) -> int:
        """Tracebacks the daemon or the agents wrote (workers' own logs are the user's business)."""
        files = [self.log, *sorted((self.state / "logs").glob("agent-*.log"))]
        return sum(p.read_text(errors="replace").count("Traceback (most recent call last)") for p in files
                   if p.exists())

    def orphans(self) -> int:
        left = wait(lambda: not procs_mentioning(str(self.state)), 20)
        procs = [] if left else procs_mentioning(str(self.state))
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        return len(procs)


def stop_and_count(d: Daemon, t: Tally) -> None:
    """Stop ``d`` and add to ``t`` what it left: a traceback in its log or a non-zero exit, and any
    process of its still running."""
    rc = d.stop()
    t.tracebacks += d.log_tracebacks() + (rc != 0)
    t.orphans += d.orphans()


@contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(top, 0o755)  # another local user must reach the control socket (spoofing part)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


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
