"""spawner.ranks: a worker's K processes start, fail and stop together (the node agent's and the rank agent's
one spawner)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spawner.ranks import LocalRanks, exit_status

PY = sys.executable


def popen(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PY, "-c", code])


def test_one_that_cannot_start_ends_those_already_started() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def start_one(i: int) -> subprocess.Popen[bytes]:
        if i == 2:
            raise OSError("no such file")
        started.append(popen("import time; time.sleep(600)"))
        return started[-1]

    with pytest.raises(OSError, match="no such file"):
        LocalRanks.start(3, start_one)
    assert len(started) == 2 and [p.returncode for p in started] == [-signal.SIGKILL] * 2


def test_the_first_failure_is_the_workers_code_once_all_have_exited() -> None:
    ranks = LocalRanks.start(3, lambda i: popen(f"import sys, time; time.sleep({0.3 * i}); sys.exit({[0, 3, 4][i]})"))
    for p in ranks.procs:
        p.wait(30)
    assert ranks.poll() == 3 and ranks.failed == 3
    assert sorted(ranks.seen.items()) == [(0, 0), (1, 3), (2, 4)]
    assert ranks.exits() == [(0, 0), (1, 3), (2, 4)] and ranks.exits() == []  # each exit is told once


class Scripted:
    """A process whose exit the test decides."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None  # type: int, int | None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        pass


def test_each_exit_is_told_once_whatever_a_poll_saw_in_between() -> None:
    """The rank agent counts each rank's exit 0 into its world's ``done`` from :meth:`LocalRanks.exits`, then
    asks :meth:`LocalRanks.poll` whether all have exited: an exit seen by that poll is still told next time
    (else a world's ``done`` stays one short and its agents never end)."""
    a, b = Scripted(1), Scripted(2)
    ranks = LocalRanks([a, b])
    a.returncode = 0
    assert ranks.exits() == [(0, 0)]
    b.returncode = 0  # exits between the two looks
    assert ranks.poll() == 0
    assert ranks.exits() == [(1, 0)] and ranks.exits() == []


def test_a_stop_sends_sigterm_then_sigkill_to_one_that_ignores_it() -> None:
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ok', flush=True); time.sleep(600)"
    ranks = LocalRanks.start(2, lambda i: subprocess.Popen([PY, "-c", ignores if i else "import time; time.sleep(600)"],
                                                           stdout=subprocess.PIPE))
    assert ranks.procs[1].stdout is not None and ranks.procs[1].stdout.readline() == b"ok\n"
    ranks.stop(30.0, now=0.0)
    ranks.procs[0].wait(30)
    assert not ranks.reap(now=1.0)  # the one ignoring SIGTERM still runs within the grace
    assert ranks.procs[1].poll() is None
    ranks.reap(now=31.0)  # past it: SIGKILL
    ranks.procs[1].wait(30)
    assert ranks.reap() and ranks.poll() == -signal.SIGTERM  # the first to exit: stopped by the SIGTERM
    assert [exit_status(p.returncode) for p in ranks.procs] == [143, 137]


ENV_LINE = """import os, sys
with open(sys.argv[1], "a") as fh:
    fh.write(os.environ.get("LOCAL_RANK", "-") + " " + os.environ.get("MALLETRAIN_LOCAL_RANKS", "-") + "\\n")
"""


@pytest.mark.parametrize("own", [False, True])
def test_k_reaches_a_workers_ranks_by_the_start_alone(own: bool, tmp_path: Path) -> None:
    """A start of K slots runs K processes, one per slot, or (``starts_own_ranks``: the torchrun rank agent)
    one process told K, which starts its K ranks itself: either way K comes from the start's ``slots``."""
    import secrets
    import time

    from scavenger import protocol as P
    from scavenger.agent import Agent

    out = tmp_path / "ranks"
    agent = Agent("n1", "tcp://127.0.0.1:1", secrets.token_bytes(32), log_dir=str(tmp_path / "logs"))
    try:
        agent.start_worker(P.StartWorker("n1", "w", (PY, "-c", ENV_LINE, str(out)), {}, str(tmp_path), slots=2,
                                         starts_own_ranks=own))
        for proc in agent.workers["w"].procs:
            assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(out.read_text().splitlines()) < (1 if own else 2):
            time.sleep(0.05)
        lines = sorted(out.read_text().splitlines())
        assert lines == (["0 2"] if own else ["0 -", "1 -"])
    finally:
        agent.kill_all(0.2)
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()
