"""How long a daemon restart takes, the figure ``agent_dead_after`` must cover.

    python benchmarks/bench_daemon_start.py [--reps 3] [--runtime torch]

Per repetition: a daemon subprocess (local backend, 2 nodes, no job) runs until both
agents are up; it is SIGKILLed (its agents go on) and started again at once on the
same state dir. Printed: kill -> the new daemon serves (``daemon.json`` written:
store, sockets, runtime up), and kill -> both surviving agents heard from again
(``agent_up`` in the new daemon's event log). An agent that hears nothing from a
daemon for ``agent_dead_after`` seconds stops its workers, so a restart must fit in
that time with room: the last line prints the default ``agent_dead_after`` as a
multiple of the slowest restart measured here (baseline: the restart itself, x1.0),
plus systemd's ``RestartSec`` (5 s in docs/malletrain.service) for a crash that
systemd restarts.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import wait_for

CONFIG = """
state_dir = "{state}"
runtime = "{runtime}"
loop_interval = 0.05
agent_heartbeat = 0.5
agent_dead_after = 60.0
backend = "local"
[local]
nodes = 2
trace = "none"
"""

RESTART_SEC = 5.0  # docs/malletrain.service: Restart=on-failure, RestartSec=5


WAIT_S = 120.0  # for each state the benchmark waits for


def agents_up_since_last_start(db: Path) -> int:
    from malletrain.daemon.store import Store

    try:
        store = Store.open(db)
    except Exception:
        return 0
    try:
        events = list(store.events())
    finally:
        store.close()
    starts = [i for i, e in enumerate(events) if e["kind"] == "daemon_start"]
    return 0 if not starts else len({e["node"] for e in events[starts[-1]:] if e["kind"] == "agent_up"})


def one(tmp: Path, runtime: str) -> tuple[float, float]:
    state, cfg = tmp / "state", tmp / "daemon.toml"
    cfg.write_text(CONFIG.format(state=state, runtime=runtime))
    argv = [sys.executable, "-m", "malletrain", "daemon", "--config", str(cfg)]
    log = open(tmp / "daemon.log", "ab")
    d = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: agents_up_since_last_start(state / "store.db") == 2, "the first daemon's agents", WAIT_S, step=0.02)
        d.send_signal(signal.SIGKILL)
        d.wait(timeout=30)
        (state / "daemon.json").unlink()  # to see the new one appear (a killed daemon leaves its own)
        t_kill = time.monotonic()
        d = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: (state / "daemon.json").exists(), "the new daemon serving", WAIT_S, step=0.02)
        serving = time.monotonic() - t_kill
        wait_for(lambda: agents_up_since_last_start(state / "store.db") == 2, "the agents back", WAIT_S, step=0.02)
        agents = time.monotonic() - t_kill
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=120)
    return serving, agents


def main(argv: list[str] | None = None) -> int:
    from malletrain.daemon.config import DaemonConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", default="torch", choices=("torch", "toy"))
    args = ap.parse_args(argv)
    serving, agents = [], []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="mt-start-") as tmp:
            s, a = one(Path(tmp), args.runtime)
        serving.append(s)
        agents.append(a)
        print(f"rep {rep + 1}: kill -> serving {s:.2f} s, kill -> agents back {a:.2f} s", flush=True)
    default = DaemonConfig().agent_dead_after
    worst = max(agents) + RESTART_SEC
    print(f"\ndaemon kill -9 and restart ({args.runtime} runtime, 2 local nodes), median / max of {args.reps}:")
    print(f"  kill -> new daemon serving (s)        {statistics.median(serving):7.2f} {max(serving):7.2f}")
    print(f"  kill -> both agents back (s)          {statistics.median(agents):7.2f} {max(agents):7.2f}")
    print(f"  with systemd RestartSec={RESTART_SEC:g} s (s)     {statistics.median(agents) + RESTART_SEC:7.2f} {worst:7.2f}")
    print(f"agent_dead_after default {default:g} s = x{default / worst:.1f} the slowest restart under systemd "
          f"(baseline x1.0: the restart itself)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
