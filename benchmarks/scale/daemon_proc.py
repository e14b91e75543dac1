"""The daemon under load: the real :class:`malletrain.daemon.Daemon`, Slurm backend, run in its own process.

    python -m benchmarks.scale.daemon_proc SETTINGS.json

``SETTINGS.json`` (written by ``benchmarks/bench_daemon_scale.py``): the daemon config as a
TOML-shaped dict (``config``), the stand-in's address (``slurm``), where to write the
figures (``out``). The backend is :class:`scavenger.slurm.SlurmBackend` whose command
runner asks the stand-in (:func:`tests.clusters.fake_slurm.remote_runner`) instead of
forking ``sinfo``/``squeue``: everything else (parsers, pilot book, hub, monitor, store,
policy) is the daemon's own.

Measured here, by wrapping methods of the daemon's parts (nothing else changes): each
decision's wall time (``decide.decide``: every trainer's view, evidence, policy and the placing
of its decision), each step's and its phases', and when the daemon learnt that a node was lost
(``observe.node_lost``). SIGTERM (or SIGINT) ends the loop; the figures go to ``out`` as JSON
before the daemon closes.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from malletrain.daemon.config import parse_config
from malletrain.daemon import Daemon, DaemonParts
from scavenger.slurm import SlurmBackend, SlurmConfig
from tests.clusters.fake_slurm import remote_runner

SLOW_STEP_S = 0.1  # steps that took longer are kept with their phases' wall times


class MeasuredDaemon(Daemon):
    """The daemon, timing its decisions and steps and noting when it learns of a lost node."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.decisions: list[tuple[float, float]] = []  # (wall time at the end, seconds)
        self.steps: list[float] = []
        self.decision_cpu: list[float] = []  # CPU seconds of each decision (what a quiet machine would take)
        self.lost: dict[str, list[float]] = {}  # node -> wall times the daemon learnt it was lost
        self.commits: list[tuple[float, int]] = []  # (wall time, store transactions so far), once a second
        self.sizes: list[tuple[float, int, int]] = []  # (wall time, agents connected, workers in jobs), with it
        self.counters: list[tuple[float, int, int, int, int, dict[str, float]]] = []  # (time, steps, frames, reports,
        #                                                                 decisions, CPU by phase so far), with it
        self.cpu = {"hub": 0.0, "monitor": 0.0, "decide": 0.0, "step": 0.0, "besides": 0.0}  # thread CPU s by
        # phase; "besides": a step's own, less the hub, monitor and decisions in it (the loop also reads agents
        # and reports between steps: hub and monitor count those too)
        self.slow_steps: list[tuple[float, float, dict[str, float]]] = []  # (wall start, seconds, wall s by
        #                                                        phase) of each step over SLOW_STEP_S
        self._phase: dict[str, float] | None = None
        super().__init__(*args, **kwargs)
        self.hub.poll = self._timed(self.hub.poll, "hub")  # type: ignore[method-assign]
        self.monitor.drain = self._timed(self.monitor.drain, "monitor")  # type: ignore[method-assign]
        observe, decide = self.observe, self.decide
        observe.pilots = self._phase_of("backend", observe.pilots)  # type: ignore[method-assign]
        observe.agents = self._phase_of("agents", observe.agents)  # type: ignore[method-assign]
        observe.progress = self._phase_of("progress", observe.progress)  # type: ignore[method-assign]
        observe.submissions = self._phase_of("store", observe.submissions)  # type: ignore[method-assign]
        self.act.act = self._phase_of("act", self.act.act)  # type: ignore[method-assign]
        decide.feed_ledgers = self._phase_of("ledgers", decide.feed_ledgers)  # type: ignore[method-assign]
        self.adoption.hold_idle_nodes = self._phase_of("hold", self.adoption.hold_idle_nodes)  # type: ignore[method-assign]
        decide.decide = self._timed_decision(self._phase_of("decide", decide.decide))  # type: ignore[method-assign]
        lose = observe.node_lost

        def node_lost(ev: Any, now: float) -> None:
            self.lost.setdefault(ev.node, []).append(time.time())
            lose(ev, now)

        observe.node_lost = node_lost  # type: ignore[method-assign]

    def _timed(self, fn: Any, phase: str) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[phase] += time.thread_time() - c0
        return timed

    def _phase_of(self, name: str, fn: Any) -> Any:
        """``fn``, its wall time added to this step's phase ``name``."""
        def phased(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self._phase is not None:
                    self._phase[name] = self._phase.get(name, 0.0) + time.perf_counter() - t0
        return phased

    def _timed_decision(self, fn: Any) -> Any:
        """``fn`` (a decision), its wall and CPU time kept."""
        def timed(now: float) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(now)
            finally:
                self.decisions.append((time.time(), time.perf_counter() - t0))
                self.decision_cpu.append(time.thread_time() - c0)
                self.cpu["decide"] += self.decision_cpu[-1]
        return timed

    def _sample(self, now: float) -> None:
        self._phase_of("sample", super()._sample)(now)

    def step(self, quick: bool = False) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        inner0 = self.cpu["hub"] + self.cpu["monitor"] + self.cpu["decide"]
        self._phase, w0 = {}, time.time()
        try:
            super().step(quick) if quick else super().step()  # (a baseline's step takes no argument)
        finally:
            phases, self._phase = self._phase, None
        self.steps.append(time.perf_counter() - t0)
        if self.steps[-1] > SLOW_STEP_S:
            phases["other"] = self.steps[-1] - sum(phases.values())
            self.slow_steps.append((w0, self.steps[-1], phases))
        own = time.thread_time() - c0
        self.cpu["step"] += own
        self.cpu["besides"] += own - (self.cpu["hub"] + self.cpu["monitor"] + self.cpu["decide"] - inner0)
        now = time.time()
        if not self.commits or now - self.commits[-1][0] >= 1.0:
            self.commits.append((now, self.store.commits))
            self.sizes.append((now, len(self.hub.alive()), sum(len(r.members) for r in self.runs.values())))
            self.counters.append((now, len(self.steps), self.hub.frames, self.monitor.received, len(self.decisions),
                                  dict(self.cpu)))


def main(argv: list[str]) -> int:
    settings = json.loads(Path(argv[0]).read_text())
    cfg = parse_config(settings["config"], "scale harness config")
    sc = cfg.scavenger
    backend = SlurmBackend(
        SlurmConfig(daemon_address=f"tcp://127.0.0.1:{cfg.ports.agents}", partition=sc.partition,
                    walltime_s=sc.walltime, nodes_per_pilot=sc.nodes_per_pilot, max_pilots=sc.max_pilots,
                    renew_before_s=sc.renew_before, max_queued_s=sc.max_queued, submit_rate=sc.submit_rate,
                    submit_burst=int(settings.get("submit_burst", 5)), command_timeout_s=sc.command_timeout),
        clock=time.time, runner=remote_runner(settings["slurm"]))
    daemon = MeasuredDaemon(cfg, parts=DaemonParts(backend=backend))
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True
        daemon.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    profile = settings.get("profile")
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    daemon.run()
    if profile:
        prof.disable()
        prof.dump_stats(profile)
    out = {
        "decisions": daemon.decisions,
        "steps": daemon.steps,
        "slow_steps": daemon.slow_steps,
        "decision_cpu": daemon.decision_cpu,
        "lost": daemon.lost,
        "monitor": daemon.monitor.counts(),
        "commits": daemon.commits,
        "sizes": daemon.sizes,
        "counters": daemon.counters,
        "hub_rejected": dict(daemon.hub.rejected),
        "usable": len(daemon.scav.usable()),
        "pilots": len(daemon.backend.pilots()),
        "jobs": {r.id: len(r.members) for r in daemon.runs.values()},
        "commands": backend.commands,
    }
    Path(settings["out"]).write_text(json.dumps(out))
    daemon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
