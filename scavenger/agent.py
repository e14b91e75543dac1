"""The node agent: one per held node, inside the pilot job (or a local process).

    python -m scavenger.agent --node NAME --daemon tcp://HOST:PORT --key-file PATH

It connects to the daemon (ZeroMQ DEALER, identity = node name), authenticates
both ways with the daemon's agent key (:mod:`scavenger.channel`; the key file's
path is given, never the key), says hello with its batch job id (``SLURM_JOB_ID``,
``PBS_JOBID`` or the local backend's ``MALLETRAIN_BATCH_JOB``), heartbeats, and
starts/stops job workers on command. A server that cannot prove the key
(another process on the daemon's port) gets nothing run: the agent logs why and
keeps trying, so it finds the real daemon when that comes back. Each worker runs in its own process group so
the agent can kill it with everything it spawned; each worker runs in a cgroup of its own where the node
has one, and the agent and each worker are subreapers, so what a worker leaves behind (a ``setsid()``
grandchild too) is killed when it ends (:mod:`scavenger.containment`). A worker's environment, working
directory and log follow :mod:`scavenger.jobproc`. On SIGTERM (the main
scheduler recalls the node) it SIGTERMs its workers (they checkpoint and exit),
SIGKILLs what is left after :data:`RECALL_GRACE_S`, reports ``leaving`` and
exits 143 within a second. If no authenticated word comes from the daemon for
``--dead-after`` seconds it does the same (exit 3), so nothing survives a lost
daemon for long.

The agent logs (to stderr, which the backend sends to ``agent-NODE.log``) its
start and daemon, each worker's start, stop and exit code, a recall, and why it
exits. Each worker's stdout and stderr go to ``--log-dir``/``WORKER.log``.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import pwd
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from scavenger import channel as C
from scavenger import containment
from scavenger import jobproc
from scavenger import protocol as P
from scavenger.warm import WARM_WAIT_S, Assignment, WarmSlot, warm_refusal

log = logging.getLogger("scavenger.agent")

LOG_FORMAT = "%(asctime)s %(levelname)s agent pid %(process)d: %(message)s"
EXIT_RECALLED = 143  # 128 + SIGTERM, what schedulers expect of a SIGTERMed job
EXIT_DAEMON_LOST = 3
EXIT_NO_KEY = 2
RECALL_GRACE_S = 0.5
"""After SIGTERM, workers get this long to checkpoint and exit before SIGKILL (the agent
itself must be gone within a second: Slurm honours GraceTime only then)."""
STOP_GRACE_S = 1.0
AUTH_RETRY_S = 1.0
AUTH_RETRY_MAX_S = 8.0
"""A challenge left unanswered is sent again after :data:`AUTH_RETRY_S`, then after twice as long at
each further silence up to this, with +-20% jitter: a hub slower than a second (a whole machine
reconnecting to a busy head node) then answers a challenge the agent still holds, instead of every
retry making its answer to the last one useless; and thousands of agents do not retry in step."""
CONNECT_RETRY_S = 0.05
OUTBOX_MAX = 1024
BATCH_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "MALLETRAIN_BATCH_JOB")
"""Where the agent finds its pilot's id: Slurm, PBS, then the local backend's variable."""


def batch_job_from(env: Mapping[str, str]) -> str | None:
    """The batch job this process runs in (the first of :data:`BATCH_JOB_VARS` set), None if
    none or not a valid id (a bad value is logged, never sent)."""
    for var in BATCH_JOB_VARS:
        value = env.get(var)
        if value:
            try:
                return P.check_batch_job(value)
            except ValueError as exc:
                log.warning("ignoring %s: %s", var, exc)
    return None


@dataclass
class _Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log: jobproc.CappedLog | None
    kill_at: float | None = None  # SIGKILL deadline after a stop


def _describe_exit(code: int) -> str:
    """``code 0`` / ``code 3`` / ``signal SIGKILL (-9)``: a worker's exit for a log line."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name} ({code})"
        except ValueError:
            return f"signal {-code} ({code})"
    return f"code {code}"


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
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


def _run_as(msg: P.StartWorker) -> "RunAs | None | str":
    """Who runs ``msg``'s worker: None (this agent's user), a :class:`RunAs`, or why it may not run.

    A root agent switches to the job's owner (never runs a job as root unless the owner is
    root); any other agent runs only jobs of its own user, since it cannot switch.
    """
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


def _open_log(path: Path, run_as: "RunAs | None") -> IO[bytes]:
    """The worker's log, 0600, owned by the user the worker runs as (never a link)."""
    return jobproc.open_private(path, *((run_as.uid, run_as.gid) if run_as is not None else (None, None)))


class Agent:
    """The agent's state and loop (run in its own process by :func:`main`).

    ``key``: the daemon's agent key (read from ``--key-file`` by :func:`main`).
    """

    def __init__(
        self,
        node: str,
        daemon: str,
        key: bytes,
        heartbeat_s: float = 0.5,
        dead_after_s: float = 10.0,
        log_dir: str | None = None,
        batch_job: str | None = None,
        warm_modules: tuple[str, ...] = (),
    ) -> None:
        if len(key) != C.KEY_BYTES:
            raise ValueError(f"agent key must be {C.KEY_BYTES} bytes, got {len(key)}")
        self.node = node
        self.daemon = daemon
        self.key = key
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = dead_after_s
        self.log_dir = Path(log_dir) if log_dir else None
        self.batch_job = batch_job
        self.workers: dict[str, _Worker] = {}
        self.containment: containment.Containment = containment.Subreaper(False)  # main() chooses
        self.next_sweep = 0.0
        self.log_max_bytes = jobproc.LOG_MAX_BYTES
        self.logs_max_total = jobproc.LOGS_MAX_TOTAL
        self.warm = WarmSlot(warm_modules) if warm_modules else None  # a worker prepared ahead (scavenger.warm)
        self.deferred: dict[str, tuple[P.StartWorker, float]] = {}  # workers waiting for the warm process
        self.leave_reason: str | None = None
        self.seq = 0
        self.session: C.Session | None = None
        self.nonce_a: bytes | None = None  # our challenge in flight
        self.nonce_h: bytes | None = None  # the server's nonce, once it answered (we sent our proof)
        self.next_auth = 0.0
        self.auth_wait = AUTH_RETRY_S  # how long the next challenge waits for its answer (grows while unanswered)
        self.outbox: list[P.AgentMessage] = []  # worker events while no session: sent after hello
        self.refused: dict[str, int] = {}  # why frames or servers were refused, and how often
        self.refusals_in_a_row = 0  # proofs the server refused since the last session
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, node.encode())
        self.sock.setsockopt(zmq.LINGER, 200)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)  # never queue frames for a connection that is not up
        self.sock.setsockopt(zmq.MAXMSGSIZE, C.MAX_FRAME)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.sock.connect(daemon)

    # -- wire
    def send(self, msg: P.AgentMessage) -> None:
        """Send ``msg`` sealed in the session; worker events wait in the outbox while there is none."""
        if self.session is None:
            if isinstance(msg, (P.WorkerStarted, P.WorkerExited)) and len(self.outbox) < OUTBOX_MAX:
                self.outbox.append(msg)
            return
        self.seq += 1
        frame = self.session.seal(P.encode(msg, self.seq))
        try:
            self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # the connection went away: this session is over
            self._lose_session("the connection to the daemon dropped")
            if isinstance(msg, (P.WorkerStarted, P.WorkerExited)) and len(self.outbox) < OUTBOX_MAX:
                self.outbox.append(msg)

    def _send_raw(self, frame: bytes) -> bool:
        try:
            self.sock.send(frame, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _refuse(self, reason: str, detail: str) -> None:
        """Log (the first time, then every 30th) why a server or a frame was refused."""
        n = self.refused[reason] = self.refused.get(reason, 0) + 1
        if n == 1 or n % 30 == 0:
            log.warning("node %s: refused %s (%s, %d times): nothing is executed without the key's proof",
                        self.node, detail, reason, n)

    def _lose_session(self, why: str) -> None:
        if self.session is not None:
            log.info("node %s: %s; authenticating again", self.node, why)
        self.session = None
        self.nonce_a = self.nonce_h = None
        self.next_auth = 0.0

    def authenticate(self, now: float) -> None:
        """Send a fresh challenge if no session and none in flight (or the last one went unanswered)."""
        if self.session is not None or now < self.next_auth:
            return
        if self.nonce_a is not None:
            self._refuse("no_answer", f"the server at {self.daemon}: no answer to the handshake within "
                                      f"{self.auth_wait:.1f} s")
            self.auth_wait = min(2 * self.auth_wait, AUTH_RETRY_MAX_S)
        self.nonce_a, self.nonce_h = C.new_nonce(), None
        self.next_auth = now + self.auth_wait * random.uniform(0.8, 1.2)
        if not self._send_raw(C.challenge_frame(self.nonce_a)):
            self.nonce_a = None  # not connected (yet): try again soon
            self.next_auth = now + CONNECT_RETRY_S

    def _on_nonce(self, frame: bytes) -> None:
        """The server's nonce: prove the key over both nonces (worthless to anyone but this server)."""
        if self.nonce_a is None or self.nonce_h is not None or self.session is not None:
            self._refuse("unexpected_nonce", f"a handshake nonce from {self.daemon} that answers no challenge")
            return
        try:
            self.nonce_h = C.parse_nonce(frame)
        except C.ChannelError as exc:
            self._refuse(exc.reason, f"the server at {self.daemon}: {exc}")
            return
        self._send_raw(C.finish_frame(C.agent_proof(self.key, self.node, self.nonce_a, self.nonce_h)))

    def _on_proof(self, frame: bytes) -> bool:
        """Check the server's proof; on success say hello. True if the server proved the key."""
        nonce_a, nonce_h = self.nonce_a, self.nonce_h
        if nonce_a is None or nonce_h is None or self.session is not None:
            self._refuse("unexpected_proof", f"a handshake proof from {self.daemon} that answers no challenge")
            return False
        self.nonce_a = self.nonce_h = None
        try:
            proof = C.parse_proof(frame)
        except C.ChannelError as exc:
            self._refuse(exc.reason, f"the server at {self.daemon}: {exc}")
            return False
        if not hmac.compare_digest(proof, C.hub_proof(self.key, self.node, nonce_a, nonce_h)):
            self._refuse("bad_proof", f"the server at {self.daemon}: it cannot prove the daemon's agent key")
            return False
        self.session = C.Session.for_agent(C.session_key(self.key, self.node, nonce_a, nonce_h))
        self.refusals_in_a_row = 0
        self.auth_wait = AUTH_RETRY_S
        log.info("node %s: authenticated the daemon at %s", self.node, self.daemon)
        self.send(P.Hello(self.node, os.getpid(), tuple(self.workers), self.batch_job))
        pending, self.outbox = self.outbox, []
        for msg in pending:
            self.send(msg)
        return True

    # -- workers
    def start_worker(self, msg: P.StartWorker, defer: bool = True) -> None:
        if msg.worker in self.workers or (defer and self._defer(msg)):
            return  # idempotent; or it waits for the warm process, which is ahead of a cold start
        if not msg.argv:
            log.error("node %s: worker %s has an empty argv; reported as exit 127", self.node, msg.worker)
            self.send(P.WorkerExited(self.node, msg.worker, 127))
            return
        run_as = _run_as(msg)
        if isinstance(run_as, str):
            log.error("node %s: worker %s refused: %s; reported as exit 126", self.node, msg.worker, run_as)
            self.send(P.WorkerExited(self.node, msg.worker, 126))
            return
        env = jobproc.worker_environ(os.environ, msg.env or {}, run_as.env if run_as is not None else None)
        out: IO[bytes] | None = None
        log_path = None
        join = self.containment.prepare(msg.worker)  # before the drop: the child joins its cgroup with it
        try:
            if self.log_dir is not None:
                jobproc.private_dir(self.log_dir)
                log_path = self.log_dir / f"{msg.worker}.log"
                jobproc.prune_logs(self.log_dir, [w.log.path for w in self.workers.values() if w.log],
                                   self.logs_max_total)
                out = _open_log(log_path, run_as)
            proc = self._warm_start(msg, env, run_as, out) or subprocess.Popen(
                list(msg.argv),
                env=env,
                preexec_fn=jobproc.child_setup(msg.cwd, join),  # after the privilege drop: cwd entered as the owner
                stdin=subprocess.DEVNULL,
                stdout=out if out else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
                start_new_session=True,
                **(run_as.popen_args() if run_as is not None else {}),
            )
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
            log.error("node %s: cannot start worker %s (%r): %s; reported as exit 127",
                      self.node, msg.worker, list(msg.argv), exc)
            if out:
                out.write(f"agent {self.node}: cannot start {msg.argv!r}: {exc}\n".encode())
                out.close()
            self.send(P.WorkerExited(self.node, msg.worker, 127))
            self.containment.end(msg.worker)
            return
        self.containment.add(msg.worker, proc.pid)
        capped = None
        if out is not None and log_path is not None:
            capped = jobproc.CappedLog(log_path, out, self.log_max_bytes,
                                       (run_as.uid, run_as.gid) if run_as is not None else None)
        self.workers[msg.worker] = _Worker(msg.worker, proc, capped)
        log.info("node %s: worker %s started, pid %d, uid %d (output: %s)", self.node, msg.worker, proc.pid,
                 run_as.uid if run_as is not None else os.geteuid(), log_path or "discarded")
        log.debug("node %s: worker %s argv %r", self.node, msg.worker, list(msg.argv))  # escaped: one line
        self.send(P.WorkerStarted(self.node, msg.worker, proc.pid))

    def _defer(self, msg: P.StartWorker) -> bool:
        """True if ``msg`` waits for the warm process still importing (see :meth:`_start_deferred`)."""
        if self.warm is None or not self.warm.starting:
            return False
        if warm_refusal(msg.argv, {**self.warm.env, **(msg.env or {})}, self.warm.env, self.warm.python):
            self.deferred.pop(msg.worker, None)
            return False
        self.deferred.setdefault(msg.worker, (msg, time.monotonic()))
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
                    out: IO[bytes] | None) -> subprocess.Popen[bytes] | None:
        """The warm process turned into ``msg``'s worker, or None (then it starts cold)."""
        if self.warm is None:
            return None
        uid, gid = (run_as.uid, run_as.gid) if run_as is not None else (None, None)
        pid = self.warm.proc.pid if self.warm.ready and self.warm.proc is not None else None
        if pid is not None:
            self.containment.add(msg.worker, pid)  # in the worker's cgroup before it learns the job
        got = self.warm.take(Assignment(tuple(msg.argv), env, msg.cwd or None, uid, gid), out)
        if isinstance(got, str):
            if pid is not None:
                self.containment.release(pid)
            log.info("node %s: worker %s starts cold: %s", self.node, msg.worker, got)
            return None
        log.info("node %s: worker %s starts warm (framework imported ahead)", self.node, msg.worker)
        return got

    def stop_worker(self, name: str, grace: float) -> None:
        if self.deferred.pop(name, None) is not None:
            self.send(P.WorkerExited(self.node, name, EXIT_RECALLED))  # stopped before it started
            return
        w = self.workers.get(name)
        if w is None or w.kill_at is not None:
            return  # idempotent
        log.info("node %s: stopping worker %s (pid %d): SIGTERM, SIGKILL after %.1f s", self.node, name,
                 w.proc.pid, float(grace))
        _signal_group(w.proc, signal.SIGTERM)
        w.kill_at = time.monotonic() + max(0.0, float(grace))

    def worker_pids(self) -> set[int]:
        """The agent's own children that are live workers (every other child is an orphan to end)."""
        pids = {w.proc.pid for w in self.workers.values()}
        if self.warm is not None and self.warm.proc is not None:
            pids.add(self.warm.proc.pid)  # the worker prepared ahead is ours, not an orphan
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
            code = w.proc.poll()
            if code is None:
                if w.kill_at is not None and now >= w.kill_at:
                    log.warning("node %s: worker %s (pid %d) still running after its grace: SIGKILL",
                                self.node, name, w.proc.pid)
                    _signal_group(w.proc, signal.SIGKILL)
                    w.kill_at = float("inf")  # killed once
                continue
            _signal_group(w.proc, signal.SIGKILL)  # leftovers of its group
            if killed := self.containment.end(name):  # and of its cgroup (setsid() ones too)
                log.info("node %s: worker %s: killed %d process(es) left in its cgroup", self.node, name, killed)
            if w.log:
                w.log.close()
            del self.workers[name]
            ended = True
            log.info("node %s: worker %s (pid %d) exited with %s", self.node, name, w.proc.pid, _describe_exit(code))
            self.send(P.WorkerExited(self.node, name, int(code)))
        if ended or now >= self.next_sweep:
            self.sweep_orphans()
            self.next_sweep = now + 1.0

    def kill_all(self, grace: float = 1.0) -> None:
        if self.workers:
            log.info("node %s: stopping all workers (%s): SIGTERM, SIGKILL after %.1f s", self.node,
                     ", ".join(sorted(self.workers)), grace)
        for w in self.workers.values():
            _signal_group(w.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in self.workers.values()):
            time.sleep(0.02)
        for w in self.workers.values():
            _signal_group(w.proc, signal.SIGKILL)
            try:
                w.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        self.reap()

    # -- loop
    def receive(self, frame: bytes) -> bool:
        """Handle one frame from the server; True if it proved to come from the daemon."""
        try:
            kind = C.kind_of(frame)
        except C.ChannelError as exc:
            self._refuse(exc.reason, f"a frame from {self.daemon}: {exc}")
            return False
        if kind is C.Kind.NONCE:
            self._on_nonce(frame)
            return False
        if kind is C.Kind.PROOF:
            return self._on_proof(frame)
        if kind is C.Kind.REAUTH:
            if self.session is not None:
                self._lose_session("the daemon does not know this session (it restarted?)")
            elif self.nonce_h is not None:  # we sent our proof: the server says it does not hold
                try:
                    why = C.parse_reauth(frame)
                except C.ChannelError:
                    why = "?"
                self.refusals_in_a_row += 1
                if self.refusals_in_a_row == 1:
                    # after a (re)connect two challenges can cross (the server answers the first with a
                    # nonce the agent's second proof does not cover): not a wrong key; try again at once
                    log.info("node %s: the server at %s refused a handshake that crossed a reconnect (%s); "
                             "trying again", self.node, self.daemon, why)
                    self.next_auth = 0.0
                else:
                    self._refuse("refused_by_server", f"our proof at {self.daemon} (it says {why!r}, "
                                                      f"{self.refusals_in_a_row} times in a row): is --key-file "
                                                      "this daemon's agent key?")
                self.nonce_a = self.nonce_h = None  # retried at the next AUTH_RETRY_S (at once the first time)
            return False
        if kind is not C.Kind.DATA:
            self._refuse("wrong_direction", f"a {kind.name} frame from {self.daemon} (agents send those)")
            return False
        if self.session is None:
            self._refuse("no_session", f"a data frame from {self.daemon} before authentication")
            return False
        try:
            body = self.session.open(frame)
        except C.ChannelError as exc:
            self._refuse(exc.reason, f"a frame from {self.daemon}: {exc}")
            return False
        self.handle(body)
        return True

    def handle(self, body: bytes) -> None:
        """Carry out one authenticated message from the daemon."""
        try:
            msg = P.decode(body)
        except P.ProtocolError as exc:
            log.warning("node %s: dropped a bad message from the daemon: %s", self.node, exc)
            return
        if msg.node != self.node or not isinstance(msg, P.TO_AGENT_TYPES):
            log.warning("node %s: dropped a %s message for %s from the daemon", self.node, msg.TYPE, msg.node)
            return
        if isinstance(msg, P.StartWorker):
            self.start_worker(msg)
        elif isinstance(msg, P.StopWorker):
            self.stop_worker(msg.worker, msg.grace)
        elif isinstance(msg, P.Shutdown):
            log.info("node %s: the daemon releases the node", self.node)
            self.leave_reason = "released"

    def _on_connection_events(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._lose_session(f"disconnected from {self.daemon}")
            elif event["event"] == zmq.EVENT_CONNECTED:
                self._lose_session(f"connected to {self.daemon}")  # a new server: prove it again

    def run(self) -> int:
        log.info("node %s: agent start, pid %d, daemon %s (heartbeat %.1f s, gives up after %.1f s of silence, "
                 "batch job %s)", self.node, os.getpid(), self.daemon, self.heartbeat_s, self.dead_after_s,
                 self.batch_job or "none")
        last_daemon = time.monotonic()
        next_hb = 0.0
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        code = 0
        try:
            while self.leave_reason is None:
                events = dict(poller.poll(50))
                if self.monitor in events:
                    self._on_connection_events()
                if self.sock in events:
                    while self.leave_reason is None:
                        try:
                            frame = self.sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if self.receive(frame):
                            last_daemon = time.monotonic()
                self.reap()
                if self.warm is not None:
                    if not self.workers:
                        self.warm.prepare()  # while the node waits for a worker (CPU is free then)
                    self.warm.poll()
                    self._start_deferred()
                now = time.monotonic()
                self.authenticate(now)
                if self.session is not None and now >= next_hb:
                    self.send(P.Heartbeat(self.node, tuple(self.workers), os.getpid()))
                    next_hb = now + self.heartbeat_s
                if self.leave_reason is None and now - last_daemon > self.dead_after_s:
                    log.warning("node %s: no word from the daemon for %.1f s", self.node, now - last_daemon)
                    self.leave_reason = "daemon_lost"
            code = {"recalled": EXIT_RECALLED, "daemon_lost": EXIT_DAEMON_LOST}.get(self.leave_reason, 0)
        except BaseException as exc:
            log.exception("node %s: agent loop failed: %s", self.node, exc)
            raise
        finally:
            if self.warm is not None:
                self.warm.close()
            self.kill_all(RECALL_GRACE_S if self.leave_reason == "recalled" else STOP_GRACE_S)
            self.containment.close()
            self.send(P.Leaving(self.node, self.leave_reason or "error"))
            self.sock.disable_monitor()
            self.monitor.close(0)
            self.sock.close()
            self.ctx.term()
            log.info("node %s: agent exit %d, reason: %s", self.node, code, self.leave_reason or "error")
        return code


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scavenger.agent", description=__doc__.splitlines()[0])
    ap.add_argument("--node", required=True)
    ap.add_argument("--daemon", required=True, help="the daemon's agent address, tcp://HOST:PORT")
    ap.add_argument("--key-file", required=True,
                    help="the daemon's agent key file (its state dir's agent.key, mode 0600)")
    ap.add_argument("--heartbeat", type=float, default=0.5, help="seconds between heartbeats")
    ap.add_argument("--dead-after", type=float, default=10.0, help="exit if the daemon is silent this long")
    ap.add_argument("--log-dir", default=None, help="write each worker's output to DIR/WORKER.log")
    ap.add_argument("--log-max-bytes", type=int, default=jobproc.LOG_MAX_BYTES,
                    help="rotate a worker's log past this size (one older part kept)")
    ap.add_argument("--logs-max-total", type=int, default=jobproc.LOGS_MAX_TOTAL,
                    help="delete the oldest logs of ended workers when --log-dir holds more than this")
    ap.add_argument("--containment", choices=containment.CHOICES, default="auto",
                    help="how a worker's processes are held and ended with it (auto: a cgroup if usable)")
    ap.add_argument("--warm", default="", help="modules a warm worker imports ahead, comma-separated "
                                                "(scavenger.warm; empty: every worker starts cold)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    recalled: list[int] = []
    agent: Agent | None = None

    def on_term(signum: int, frame: object) -> None:
        recalled.append(signum)
        if agent is not None:
            if agent.leave_reason is None:
                log.info("node %s: %s: the node is recalled", agent.node, signal.Signals(signum).name)
            agent.leave_reason = "recalled"

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        key = C.read_key_file(args.key_file)
    except C.KeyFileError as exc:
        log.error("node %s: %s; exiting", args.node, exc)
        return EXIT_NO_KEY
    if not P.is_node_name(args.node):
        log.error("node name %r: must be 1-%d printable ASCII characters without spaces", args.node, P.NAME_MAX)
        return EXIT_NO_KEY
    agent = Agent(args.node, args.daemon, key, args.heartbeat, args.dead_after, args.log_dir,
                  batch_job=batch_job_from(os.environ),
                  warm_modules=tuple(m for m in args.warm.split(",") if m))
    agent.log_max_bytes, agent.logs_max_total = args.log_max_bytes, args.logs_max_total
    agent.containment = containment.choose(args.containment)
    log.info("node %s: containment: %s", args.node, agent.containment.description)
    if recalled:
        agent.leave_reason = "recalled"
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
