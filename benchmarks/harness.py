"""What the benchmarks share: the quick mode's ``--short`` and the last line a benchmark prints (with the
machine's load beside its figure), waiting for a condition, a real ``malletrain daemon`` subprocess in a
scratch dir and the CLI beside it, stepping an in-process daemon until a condition, and a free port.

    from harness import Daemon, add_short, cli, last_line, load, step_until, wait, wait_for, workdir

A benchmark with a quick mode takes it as ``--short`` (:func:`add_short`): what CI runs
(tests/test_benchmarks_run.py), the same path to the same last line, on less. Its last line is printed by
:func:`last_line`, so every one ends the same way: the figure, then the load it was measured under.

Scripts in ``benchmarks/`` import it as a sibling (their folder is on ``sys.path``); the attack suite
(``benchmarks/attacks/``) puts ``benchmarks/`` on ``sys.path`` first (``faults_common.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from malletrain.daemon import Daemon as InProcessDaemon

ROOT = Path(__file__).resolve().parent.parent  # the repository
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # the test clusters (tests/clusters) the benchmarks start
PY = sys.executable
NOBODY = 65534


# ---------------------------------------------------------------- the command line and the last line
def add_short(ap: argparse.ArgumentParser, what: str) -> None:
    """The quick mode, ``--short``: ``what`` says what it runs instead of the whole benchmark (its help)."""
    ap.add_argument("--short", action="store_true", help=f"the quick mode CI runs: {what}")


def last_line(text: str) -> None:
    """Print a benchmark's last line: ``text`` (its figure or verdict), then the machine's load and cores."""
    print(f"{text} [load {load()}, {os.cpu_count()} cores]", flush=True)


# ---------------------------------------------------------------- waiting
def wait(pred: Callable[[], Any], timeout: float, step: float = 0.2) -> Any:
    """``pred()``'s first true value within ``timeout`` seconds, or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    return None


def wait_for(pred: Callable[[], Any], what: str, timeout: float, step: float = 0.1) -> Any:
    """``pred()``'s first true value within ``timeout`` seconds; TimeoutError naming ``what`` otherwise."""
    value = wait(pred, timeout, step)
    if not value:
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
    return value


def step_until(d: InProcessDaemon, what: str, pred: Callable[[], bool], timeout_s: float) -> None:
    """Run an in-process daemon's loop until ``pred()``; fail naming ``what`` (and the last events) after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        d.step()
        if pred():
            return
        d.monitor.drain(timeout_ms=int(d.cfg.loop_interval * 1000))
    raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}; events: {list(d.store.events())[-8:]}")


# ---------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load() -> str:
    """The 1-, 5- and 15-minute load averages, for the line a benchmark prints beside its figure."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def cli(*args: str, timeout: float = 60, as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
    """``malletrain ARGS`` in a subprocess (as the ``nobody`` user with ``as_nobody``)."""
    argv = [PY, "-m", "malletrain", *args]
    if as_nobody:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


@contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    """A scratch folder another local user can reach (the spoofing attacks need its control socket)."""
    top = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(top, 0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


class Daemon:
    """One ``malletrain daemon`` subprocess on ``top/state`` with ``config`` (TOML text with a
    ``{state}`` field)."""

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
        """Processes still mentioning the state dir 20 s after the daemon stopped (killed, and counted)."""
        import psutil  # here, not above: a benchmark's child run in another tree imports this module too

        from malletrain.cli.procs import procs_mentioning

        left = wait(lambda: not procs_mentioning(str(self.state)), 20)
        procs = [] if left else procs_mentioning(str(self.state))
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        return len(procs)
