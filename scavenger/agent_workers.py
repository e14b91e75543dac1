"""The workers a node agent runs (a mixin of :class:`scavenger.agent.Agent`).

Each worker runs in its own process group, as the job's owner when a root agent starts it
(:func:`run_as_owner`), set up by :mod:`scavenger.jobproc`; one assigned while the warm process
still imports waits for it. Stopping is SIGTERM, then SIGKILL after the grace.
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from contract.exits import EXIT_SIGTERM  # what schedulers expect of a SIGTERMed job
from scavenger import containment
from scavenger.logpump import LogPump
from scavenger import jobproc
from scavenger import protocol as P
from scavenger.warm import WARM_WAIT_S, Assignment, WarmSlot, warm_refusal
from spawner.ranks import LocalRanks, pin_cores
from spawner.slots import ENV_LOCAL_RANKS, Accelerator, SlotPlace, slot_place

log = logging.getLogger("scavenger.agent")

LOCAL_FAILURE_GRACE_S = 5.0
"""Seconds the other local ranks of a worker get after one of them failed (SIGTERM, then SIGKILL)."""


def warm_slot_envs(base: dict[str, str], slots: int, acc: Accelerator, cores: tuple[int, ...],
                   ) -> list[tuple[tuple[int, ...], dict[str, str]]]:
    """(cores, environment) of the warm process of each of ``slots`` slots: ``base`` (the agent's allowed
    variables) plus what a worker of that slot is started with (its thread count) so the warm process's
    start-time variables match the worker's (:func:`scavenger.warm.warm_refusal`)."""
    out = []
    for i in range(slots):
        place = slot_place(i, slots, acc, base, cores, {})
        env = {k: v for k, v in base.items() if k != "OMP_NUM_THREADS" or slots == 1}
        env.update({k: v for k, v in place.env.items() if k == "OMP_NUM_THREADS"})
        out.append((place.cores if slots > 1 else (), env))
    return out


@dataclass
class Worker:
    """One running worker: its K processes (:class:`spawner.ranks.LocalRanks`, each leading its process
    group; its exit is reported once, with the first failure's code) and its capped log."""

    name: str
    ranks: LocalRanks[subprocess.Popen[bytes]]
    log: LogPump | None
    stopped: bool = False  # the agent sent it a stop (the daemon's, or its node's recall): its exit is ours

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """Local rank 0's process."""
        return self.ranks.procs[0]

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        """Every process of the worker, local rank 0 first."""
        return self.ranks.procs

    def poll(self) -> int | None:
        """None while any process runs; then the worker's code: the first failure's, else 0."""
        return self.ranks.poll()


def _describe_exit(code: int) -> str:
    """``code 0`` / ``code 3`` / ``signal SIGKILL (-9)``: a worker's exit for a log line."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name} ({code})"
        except ValueError:
            return f"signal {-code} ({code})"
    return f"code {code}"


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal a process's group (a worker's process leads its own: what it started gets the signal too)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(frozen=True)
class RunAs:
    """The user a worker runs as: the job's owner, when a root agent starts it."""

    uid: int
    gid: int
    env: dict[str, str]

    def popen_args(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def run_as_owner(msg: P.StartWorker) -> "RunAs | None | str":
    """Who runs ``msg``'s worker: None (this agent's user), a :class:`RunAs`, or why it may not run: a
    root agent switches to the job's owner; any other runs only its own user's jobs."""
    if msg.uid is None or msg.uid == os.geteuid():
        return None
    if os.geteuid() != 0:
        return f"the job belongs to uid {msg.uid} and this agent (uid {os.geteuid()}) cannot switch users"
    gid = msg.gid
    env: dict[str, str] = {}
    try:
        pw = pwd.getpwuid(msg.uid)
    except KeyError:
        pass  # a uid without a passwd entry still runs, with the gid given
    else:
        env = {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name}
        gid = pw.pw_gid if gid is None else gid
    if gid is None:
        return f"uid {msg.uid} has no passwd entry and the job names no gid"
    return RunAs(msg.uid, gid, env)


def _open_log(path: Path, run_as: "RunAs | None", max_bytes: int) -> LogPump:
    """The worker's log, 0600, owned by the user the worker runs as (never a link), written through a
    pipe that keeps its cap and the disk's reserve (:mod:`scavenger.logpump`)."""
    return LogPump(path, max_bytes, (run_as.uid, run_as.gid) if run_as is not None else None)


class WorkerHost:
    """Start, stop, reap and kill the node's workers; :class:`scavenger.agent.Agent` sets the state
    in its ``__init__`` and sends what happened (:meth:`send`)."""

    node: str
    log_dir: Path | None
    workers: dict[str, Worker]
    containment: containment.Containment  # holds a worker's processes and ends them with it
    next_sweep: float
    log_max_bytes: int
    logs_max_total: int
    warm: WarmSlot | None  # a worker prepared ahead (scavenger.warm): local rank 0's
    warm_more: list[WarmSlot]  # those of local ranks 1 .. K-1 (once a start said the node has K slots)
    slots: int  # the node's worker slots, as the daemon's last start said (1 until then)
    accelerator: Accelerator  # the node's kind of device (contract.nodeshape)
    cores: tuple[int, ...]  # the agent's CPU set, shared among the slots
    deferred: dict[str, tuple[P.StartWorker, float]]  # workers waiting for the warm process

    def send(self, msg: P.AgentMessage) -> None:
        raise NotImplementedError

    def leaving(self) -> bool:
        """Whether the agent is leaving (its node recalled: the scheduler signals the whole step, workers
        included, so a worker's stop code is then the recall's); the agent says."""
        return False

    def start_worker(self, msg: P.StartWorker, defer: bool = True) -> None:
        if msg.worker in self.workers or (defer and self._defer(msg)):
            return  # idempotent; or it waits for the warm process, which is ahead of a cold start
        if not msg.argv:
            log.error("node %s: worker %s has an empty argv; reported as exit 127", self.node, msg.worker)
            self.send(P.WorkerExited(self.node, msg.worker, 127))
            return
        run_as = run_as_owner(msg)
        if isinstance(run_as, str):
            log.error("node %s: worker %s refused: %s; reported as exit 126", self.node, msg.worker, run_as)
            self.send(P.WorkerExited(self.node, msg.worker, 126))
            return
        procs = 1 if msg.starts_own_ranks else msg.slots  # one process that starts its K ranks itself, or K
        self.learn_slots(msg.slots)  # the node's shape either way: what its next worker is prepared for
        if msg.starts_own_ranks:
            for idle in self.warm_more:  # its ranks fork from its own servers: made again once the node has no worker
                idle.close()
        env = jobproc.worker_environ(os.environ, msg.env or {}, run_as.env if run_as is not None else None)
        if msg.starts_own_ranks:
            env[ENV_LOCAL_RANKS] = str(msg.slots)
        out: IO[bytes] | None = None
        pump: LogPump | None = None
        log_path = None
        join = self.containment.prepare(msg.worker)  # before the drop: the child joins its cgroup with it
        try:
            places = [slot_place(i, procs, self.accelerator, os.environ, self.cores, msg.env or {})
                      for i in range(procs)]
            if self.log_dir is not None:
                jobproc.private_dir(self.log_dir)
                log_path = self.log_dir / f"{msg.worker}.log"
                jobproc.prune_logs(self.log_dir, [w.log.path for w in self.workers.values() if w.log],
                                   self.logs_max_total)
                pump = _open_log(log_path, run_as, self.log_max_bytes)
                out = pump.write_end
            ranks = LocalRanks.start(  # one that cannot start ends those already started
                procs, lambda i: self._start_slot(msg, places[i], {**env, **places[i].env}, run_as, out, join),
                _signal_group)
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
            log.error("node %s: cannot start worker %s (%r): %s; reported as exit 127",
                      self.node, msg.worker, list(msg.argv), exc)
            if out:
                out.write(f"agent {self.node}: cannot start {msg.argv!r}: {exc}\n".encode())
                out.close()
            self.send(P.WorkerExited(self.node, msg.worker, 127))
            self.containment.end(msg.worker)
            return
        for proc in ranks.procs:
            self.containment.add(msg.worker, proc.pid)
        if pump is not None:
            pump.spawned()  # the workers hold the pipe now; the agent's copy would keep it open forever
        proc = ranks.procs[0]
        self.workers[msg.worker] = Worker(msg.worker, ranks, pump)
        log.info("node %s: worker %s started, pid %s, uid %d (output: %s)", self.node, msg.worker,
                 ", ".join(str(p.pid) for p in ranks.procs), run_as.uid if run_as is not None else os.geteuid(),
                 log_path or "discarded")
        log.debug("node %s: worker %s argv %r", self.node, msg.worker, list(msg.argv))  # escaped: one line
        self.send(P.WorkerStarted(self.node, msg.worker, proc.pid))

    def _start_slot(self, msg: P.StartWorker, place: SlotPlace, env: dict[str, str], run_as: "RunAs | None",
                    out: IO[bytes] | None, join: Any) -> subprocess.Popen[bytes]:
        """Local rank ``place.local_rank`` of ``msg``'s worker: its warm process if one fits, else a new one
        pinned to the slot's cores."""
        warm = self.warm_of(place.local_rank)
        if warm is not None and place.local_world_size > 1 and warm.cores != place.cores:
            warm = None  # prepared for another shape of the node
        proc = self._warm_start(msg, env, run_as, out, warm)
        if proc is not None:
            return proc
        setup = jobproc.child_setup(msg.cwd, join)  # after the privilege drop: cwd entered as the owner
        return subprocess.Popen(
            list(msg.argv),
            env=env,
            preexec_fn=pin_cores(place.cores, setup) if place.local_world_size > 1 else setup,
            stdin=subprocess.DEVNULL,
            stdout=out if out else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
            start_new_session=True,
            umask=msg.umask if msg.umask is not None else -1,  # the submitter's; -1: the agent's
            **(run_as.popen_args() if run_as is not None else {}),
        )

    def warm_of(self, local_rank: int) -> WarmSlot | None:
        """The warm process prepared for slot ``local_rank`` (None: none)."""
        if local_rank == 0:
            return self.warm
        more = self.warm_more
        return more[local_rank - 1] if local_rank - 1 < len(more) else None

    def learn_slots(self, slots: int) -> None:
        """The node has ``slots`` worker slots (the daemon's word in a start): keep one warm process per
        slot, each with the slot's cores and thread count, from the next start on."""
        if self.warm is None or slots == self.slots:
            return
        self.slots = slots
        for extra in self.warm_more:
            extra.close()
        self.warm_more = []
        envs = warm_slot_envs(jobproc.worker_environ(os.environ, {}, None), slots, self.accelerator, self.cores)
        if (self.warm.cores, self.warm.env) != envs[0]:
            self.warm.close()  # imported with another thread count or cores: made again for this shape
            self.warm.cores, self.warm.env = envs[0]
        for cores, env in envs[1:]:
            self.warm_more.append(WarmSlot(self.warm.modules, self.warm.python, env, cores=cores))

    def prepare_warm(self) -> None:
        """Start the warm processes of every slot that has none (idempotent)."""
        for slot in [self.warm, *self.warm_more]:
            if slot is not None:
                slot.prepare()
                slot.poll()

    def _defer(self, msg: P.StartWorker) -> bool:
        """True if ``msg`` waits for the warm process still importing (see :meth:`_start_deferred`)."""
        if self.warm is None or not self.warm.starting:
            return False
        if warm_refusal(msg.argv, {**self.warm.env, **(msg.env or {})}, self.warm.env, self.warm.python):
            self.deferred.pop(msg.worker, None)
            return False
        if msg.worker not in self.deferred:
            log.info("node %s: worker %s waits for the warm worker, importing for %.2f s", self.node, msg.worker,
                     time.monotonic() - self.warm.spawned_at)
            self.deferred[msg.worker] = (msg, time.monotonic())
        return True

    def _start_deferred(self) -> None:
        """Start the workers that waited, once the warm process is ready (or gone, or too slow)."""
        now = time.monotonic()
        for name, (msg, first) in list(self.deferred.items()):
            if self.warm is not None and self.warm.starting and now - first > WARM_WAIT_S:
                log.warning("node %s: the warm worker is still importing after %.0f s; killed, worker %s starts "
                            "cold", self.node, now - first, name)
                self.warm.close()
            if self.warm is None or not self.warm.starting:
                del self.deferred[name]
                self.start_worker(msg, defer=False)

    def _warm_start(self, msg: P.StartWorker, env: dict[str, str], run_as: "RunAs | None",
                    out: IO[bytes] | None, warm: WarmSlot | None) -> subprocess.Popen[bytes] | None:
        """The warm process ``warm`` turned into (a local rank of) ``msg``'s worker, or None (then it starts cold)."""
        if warm is None:
            return None
        uid, gid = (run_as.uid, run_as.gid) if run_as is not None else (None, None)
        pid = warm.proc.pid if warm.ready and warm.proc is not None else None
        if pid is not None:
            self.containment.add(msg.worker, pid)  # in the worker's cgroup before it learns the job
        got = warm.take(Assignment(tuple(msg.argv), env, msg.cwd or None, uid, gid, msg.umask), out,
                        msg.starts_own_ranks)
        if isinstance(got, str):
            if pid is not None:
                self.containment.release(pid)
            log.info("node %s: worker %s starts cold: %s", self.node, msg.worker, got)
            return None
        log.info("node %s: worker %s starts warm (framework imported ahead%s)", self.node, msg.worker,
                 f"; it forks its {msg.slots} rank server(s)" if msg.starts_own_ranks else "")
        return got

    def stop_worker(self, name: str, grace: float) -> None:
        if self.deferred.pop(name, None) is not None:
            self.send(P.WorkerExited(self.node, name, EXIT_SIGTERM))  # stopped before it started
            return
        w = self.workers.get(name)
        if w is None or w.ranks.kill_at is not None:
            return  # idempotent
        log.info("node %s: stopping worker %s (pid %d): SIGTERM, SIGKILL after %.1f s", self.node, name,
                 w.proc.pid, float(grace))
        w.stopped = True
        w.ranks.stop(float(grace))

    def worker_pids(self) -> set[int]:
        """The agent's own children that are live workers (every other child is an orphan to end)."""
        pids = {p.pid for w in self.workers.values() for p in w.procs}
        for warm in [self.warm, *self.warm_more]:
            if warm is not None and warm.proc is not None:
                pids.add(warm.proc.pid)  # a worker prepared ahead is ours, not an orphan
        return pids

    def sweep_orphans(self) -> None:
        """Kill what ended workers left behind (re-parented to this subreaper agent)."""
        if killed := self.containment.sweep(self.worker_pids()):
            log.info("node %s: killed %d process(es) left behind by ended workers", self.node, killed)

    def reap(self) -> None:
        now = time.monotonic()
        ended = False
        for name, w in list(self.workers.items()):
            if w.log is not None:
                w.log.check()
            ranks = w.ranks
            code = ranks.poll()
            if code is None:
                if ranks.failed is not None and ranks.kill_at is None:
                    log.warning("node %s: worker %s: a local rank failed (%s): its node's other ranks stop too",
                                self.node, name, _describe_exit(ranks.failed))
                    ranks.stop(LOCAL_FAILURE_GRACE_S, now)
                if ranks.kill_at is not None and now >= ranks.kill_at:
                    log.warning("node %s: worker %s (pid %d) still running after its grace: SIGKILL",
                                self.node, name, w.proc.pid)
                ranks.reap(now)  # SIGKILL, once, past the grace
                continue
            ranks.signal(signal.SIGKILL)  # leftovers of its groups
            if killed := self.containment.end(name):  # and of its cgroup (setsid() ones too)
                log.info("node %s: worker %s: killed %d process(es) left in its cgroup", self.node, name, killed)
            if w.log:
                w.log.close()
            del self.workers[name]
            ended = True
            log.info("node %s: worker %s (pid %d) exited with %s", self.node, name, w.proc.pid, _describe_exit(code))
            self.send(P.WorkerExited(self.node, name, int(code), w.stopped or self.leaving()))
        if ended or now >= self.next_sweep:
            self.sweep_orphans()
            self.next_sweep = now + 1.0

    def kill_all(self, grace: float = 1.0) -> None:
        if self.workers:
            log.info("node %s: stopping all workers (%s): SIGTERM, SIGKILL after %.1f s", self.node,
                     ", ".join(sorted(self.workers)), grace)
        for w in self.workers.values():
            w.stopped = True
            w.ranks.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(w.poll() is None for w in self.workers.values()):
            time.sleep(0.02)
        for w in self.workers.values():
            w.ranks.signal(signal.SIGKILL)
            for p in w.procs:
                try:
                    p.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
        self.reap()

