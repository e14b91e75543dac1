"""The node agent: one per held node, inside the pilot job (or a local process).

    python -m scavenger.agent --node NAME --daemon tcp://HOST:PORT --key-file PATH

It connects to the daemon (DEALER, identity = node name), authenticates both ways with the daemon's
agent key (:mod:`scavenger.channel`), says hello with its batch job id, heartbeats, and starts/stops
workers on command. A server that cannot prove the key gets nothing run; the agent keeps trying, so
it finds the real daemon when that comes back. What a worker leaves behind is killed when it ends
(:mod:`scavenger.containment`). On SIGTERM (a recall) it SIGTERMs its workers, SIGKILLs what is left
after :data:`RECALL_GRACE_S`, reports ``leaving`` and exits 143; after ``--dead-after`` seconds
without an authenticated word from the daemon it does the same (exit 3). It logs to stderr
(``agent-NODE.log``); each worker's output goes to ``--log-dir``/``WORKER.log``.
"""

from __future__ import annotations

import sys

from scavenger.warm import WarmSlot, early_slot

EARLY_WARM = early_slot(sys.argv[1:]) if __name__ == "__main__" else None
"""Run as the agent program (the pilot's command), the warm process starts here, before the agent's own
imports below (zmq, the channel, containment: 0.2 s of CPU, 0.5 s at this machine's load), so the
framework's import -- the longest stage of a node's return -- begins with the pilot's process;
:func:`main` hands it to the agent. Imported as a module (tests, the local backend's in-process use),
nothing starts."""

import argparse  # noqa: E402  (after the warm process's start: see EARLY_WARM)
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Mapping, Sequence  # noqa: E402

import zmq  # noqa: E402

from scavenger import channel as C  # noqa: E402
from scavenger import containment  # noqa: E402
from scavenger import jobproc  # noqa: E402
from scavenger import protocol as P  # noqa: E402
from scavenger.agent_link import (  # noqa: E402
    AUTH_RETRY_MAX_S,
    AUTH_RETRY_S,
    CONNECT_RETRY_S,
    OUTBOX_MAX,
    DaemonLink,
)
from scavenger.agent_workers import RunAs, Worker, WorkerHost, run_as_owner  # noqa: E402
from contract.exits import EXIT_SIGTERM
from spawner.slots import detect_accelerator, local_device_count  # noqa: E402
from contract.workerenv import ENV_BATCH_JOB  # noqa: E402

__all__ = ("AUTH_RETRY_MAX_S", "AUTH_RETRY_S", "CONNECT_RETRY_S", "EXIT_DAEMON_LOST", "EXIT_NO_KEY", "EXIT_SIGTERM",
           "OUTBOX_MAX", "RECALL_GRACE_S", "STOP_GRACE_S", "Agent", "RunAs", "Worker", "batch_job_from", "main",
           "run_as_owner")

log = logging.getLogger("scavenger.agent")

LOG_FORMAT = "%(asctime)s %(levelname)s agent pid %(process)d: %(message)s"
EXIT_DAEMON_LOST = 3
EXIT_NO_KEY = 2
RECALL_GRACE_S = 0.5
"""After SIGTERM, workers get this long to checkpoint and exit before SIGKILL (the agent
itself must be gone within a second: Slurm honours GraceTime only then)."""
STOP_GRACE_S = 1.0
POLL_MS = 50
"""The loop's longest wait for something to happen (timers: heartbeats, reaping, retries)."""
BATCH_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", ENV_BATCH_JOB)
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


def _dev_names() -> list[str]:
    """The names under ``/dev`` (what tells the node's accelerator; none where it cannot be read)."""
    try:
        return os.listdir("/dev")
    except OSError:
        return []


def process_age() -> str:
    """Seconds since this process started (its interpreter's start and imports included), or ``?``
    where ``/proc`` does not say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return f"{uptime - int(fields[19]) / os.sysconf('SC_CLK_TCK'):.2f}"
    except (OSError, ValueError, IndexError):
        return "?"


class Agent(DaemonLink, WorkerHost):
    """The agent's state and loop: the link to the daemon (:class:`scavenger.agent_link.DaemonLink`)
    and the node's workers (:class:`scavenger.agent_workers.WorkerHost`); ``key``: the agent key."""

    def __init__(self, node: str, daemon: str, key: bytes, heartbeat_s: float = 0.5, dead_after_s: float = 10.0,
                 log_dir: str | None = None, batch_job: str | None = None, warm_modules: tuple[str, ...] = (),
                 warm: WarmSlot | None = None) -> None:
        if len(key) != C.KEY_BYTES:
            raise ValueError(f"agent key must be {C.KEY_BYTES} bytes, got {len(key)}")
        self.node = node
        self.daemon = daemon
        self.key = key
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = dead_after_s
        self.log_dir = Path(log_dir) if log_dir else None
        self.batch_job = batch_job
        self.workers: dict[str, Worker] = {}
        self.containment: containment.Containment = containment.Subreaper(False)  # main() chooses
        self.next_sweep = 0.0
        self.log_max_bytes = jobproc.LOG_MAX_BYTES
        self.logs_max_total = jobproc.LOGS_MAX_TOTAL
        if warm is None and warm_modules:
            warm = WarmSlot(warm_modules)
        self.warm = warm  # a worker prepared ahead (scavenger.warm); ``warm``: one started already
        self.warm_more: list[WarmSlot] = []  # the warm processes of local ranks 1 .. K-1
        self.slots = 1
        self.accelerator = detect_accelerator(os.environ, _dev_names())
        self.cores = tuple(sorted(os.sched_getaffinity(0)))
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
        self.sock.setsockopt(zmq.IDENTITY, P.agent_identity(node))  # its own: never a replaced agent's
        self.sock.setsockopt(zmq.LINGER, 200)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)  # never queue frames for a connection that is not up
        self.sock.setsockopt(zmq.MAXMSGSIZE, C.MAX_FRAME)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.sock.connect(daemon)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.watched: socket.socket | None = None  # the warm process's socket, watched while it imports

    def leaving(self) -> bool:
        return self.leave_reason is not None

    def wait_events(self, timeout_ms: int) -> dict[object, int]:
        """Wait up to ``timeout_ms`` for a frame from the daemon, a connection event, or the word of
        the warm process still importing (its ``ready`` ends the wait at once: a worker deferred
        until then starts without waiting for the next loop)."""
        importing = self.warm.sock if self.warm is not None and self.warm.starting else None
        if importing is not self.watched:
            if self.watched is not None:
                self.poller.unregister(self.watched)
            if importing is not None:
                self.poller.register(importing, zmq.POLLIN)
            self.watched = importing
        return dict(self.poller.poll(timeout_ms))

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


    def run(self) -> int:
        log.info("node %s: agent start, pid %d (up %s s), daemon %s (heartbeat %.1f s, gives up after %.1f s of "
                 "silence, batch job %s)", self.node, os.getpid(), process_age(), self.daemon, self.heartbeat_s,
                 self.dead_after_s, self.batch_job or "none")
        if self.warm is not None and not self.workers:
            self.warm.prepare()  # first: the framework imports while the pilot registers (before the first challenge)
        last_daemon = time.monotonic()
        next_hb = 0.0
        code = 0
        try:
            while self.leave_reason is None:
                events = self.wait_events(POLL_MS)
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
                        self.prepare_warm()  # while the node waits for a worker (CPU is free then)
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
            code = {"recalled": EXIT_SIGTERM, "daemon_lost": EXIT_DAEMON_LOST}.get(self.leave_reason, 0)
        except BaseException as exc:
            log.exception("node %s: agent loop failed: %s", self.node, exc)
            raise
        finally:
            for warm in [self.warm, *self.warm_more]:
                if warm is not None:
                    warm.close()
            self.kill_all(RECALL_GRACE_S if self.leave_reason == "recalled" else STOP_GRACE_S)
            self.containment.close()
            self.send(P.Leaving(self.node, self.leave_reason or "error"))
            self.sock.disable_monitor()
            self.monitor.close(0)
            self.sock.close()
            self.ctx.term()
            log.info("node %s: agent exit %d, reason: %s", self.node, code, self.leave_reason or "error")
        return code


def main(argv: Sequence[str] | None = None, warm: WarmSlot | None = None) -> int:
    """The agent program; ``warm``: a warm process started already for it (:data:`EARLY_WARM`), which it
    takes over (and ends if it does not run)."""
    try:
        return _main(argv, warm)
    finally:
        if warm is not None:
            warm.close()  # (the agent closed it already when it ran: idempotent)


def _main(argv: Sequence[str] | None, warm: WarmSlot | None) -> int:
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
    ap.add_argument("--slots", type=int, default=None,
                    help="the node's worker slots (contract.nodeshape), so a warm worker is prepared for each "
                         "from the start (default: the GPUs this agent sees); a start from the daemon with "
                         "another count changes it")
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
    modules = tuple(m for m in args.warm.split(",") if m)
    if warm is not None and warm.modules != modules:
        warm.close()
        warm = None
    if warm is not None and warm.proc is not None:
        log.info("warm worker pid %d: importing %s (started with the agent's process, %.2f s ago)", warm.proc.pid,
                 ", ".join(modules), time.monotonic() - warm.spawned_at)
    agent = Agent(args.node, args.daemon, key, args.heartbeat, args.dead_after, args.log_dir,
                  batch_job=batch_job_from(os.environ), warm_modules=modules, warm=warm)
    agent.log_max_bytes, agent.logs_max_total = args.log_max_bytes, args.logs_max_total
    agent.containment = containment.choose(args.containment, containment.installation_id(key))
    slots = args.slots if args.slots is not None else local_device_count(agent.accelerator, os.environ, _dev_names())
    if slots > 1:
        agent.learn_slots(min(slots, P.SLOTS_MAX))
    log.info("node %s: containment: %s", args.node, agent.containment.description)
    if recalled:
        agent.leave_reason = "recalled"
    return agent.run()


if __name__ == "__main__":
    sys.exit(main(warm=EARLY_WARM))
