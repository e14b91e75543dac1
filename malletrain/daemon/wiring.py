"""Wiring: what a daemon is built on, on its state dir (lock, store, sockets and ports, runtimes,
backend, scavenging), the ``daemon.json`` that says where it listens, and closing them all. The parts
of the daemon get these at construction; the wiring calls none of them."""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from malletrain.daemon.config import ConfigError, DaemonConfig, ScavengerConfig
from malletrain.daemon.control import Caller, ControlServer, Request, admin_gids_from, socket_path
from malletrain.daemon.records import CHECKPOINT_DIR, STATE_FILE, STORE_FILE, DaemonError
from malletrain.daemon.state import Runtimes, log
from malletrain.daemon.metrics import Metrics
from contract.messages import job_secret
from contract.workerenv import ENV_MONITOR
from malletrain.daemon.monitor import Monitor, ReplaySaver, load_master_key
from malletrain.runtimes import Runtime
from malletrain.runtimes.torch_elastic import write_private_file
from malletrain.runtimes.torchrun import TorchrunRuntime
from malletrain.daemon.scavenging import Scavenging
from malletrain.daemon.statedir import DIR_MODE
from malletrain.daemon.store import Store
from scavenger import jobproc
from scavenger.base import SchedulerBackend, observed, run_command
from scavenger.channel import AGENT_KEY_FILE
from scavenger.connguard import raise_nofile_limit
from scavenger.hub import AgentHub
from scavenger.local import LocalBackend, slot_timeline
from traces.model import IdleTimeline


def load_timeline(cfg: DaemonConfig) -> IdleTimeline | None:
    """The local backend's idle-node trace (None: always idle, ``trace = "none"``): ``synthetic`` or a
    log via :func:`traces.read`, its first idle nodes (:func:`scavenger.local.slot_timeline`)."""
    trace = cfg.local.trace
    if trace == "none":
        return None
    if trace == "synthetic":
        from traces.synthetic import summit_like

        # the independent-node model: Summit's bursts scaled down to a few dozen nodes leave every
        # node busy for an hour or more at a time, which is no way to show a handful of local nodes
        tl = summit_like(cfg.local.machine_nodes, cfg.local.duration, cfg.local.seed, bursty=False)
    else:
        from traces import read

        tl = read(trace)
    return slot_timeline(tl, cfg.local.nodes)


def make_runtime(cfg: DaemonConfig, monitor_address: str, rendezvous_port: int = 0) -> Runtime:
    """The configured runtime; ``rendezvous_port`` is where the torch runtime serves its store (0: any)."""
    if cfg.runtime == "toy":
        from malletrain.runtimes.toy import ToyRuntime

        return ToyRuntime(str(cfg.state_path / "toy"), monitor=monitor_address)
    if cfg.runtime == "torch":
        from malletrain.runtimes.torch_elastic import TorchRuntime

        return TorchRuntime(host=cfg.ports.host, port=rendezvous_port, monitor=monitor_address,
                            store_grace_s=cfg.store_grace, checkpoint_dir=cfg.state_path / CHECKPOINT_DIR)
    if cfg.runtime == "horovod":
        from malletrain.runtimes.horovod_elastic import HorovodRuntime

        return HorovodRuntime(str(cfg.state_path / "horovod"), local=cfg.backend == "local",
                              env={ENV_MONITOR: monitor_address})
    raise ConfigError(f"unknown runtime {cfg.runtime!r}")


@dataclass
class DaemonParts:
    """What a test (or another front end) gives the daemon instead of the real monitor, hub, runtime and
    backend (``tests/test_conformance.py`` drives the daemon with fakes of all four)."""

    monitor: Monitor | None = None
    hub: AgentHub | None = None
    runtime: Runtime | None = None
    backend: SchedulerBackend | None = None


class Wiring:
    """Construction: :meth:`__init__` takes the state dir's lock, :meth:`_open` builds the rest,
    :meth:`open_control` binds the control socket; :meth:`close` (or :meth:`abandon`, after a failure) closes it all."""

    store: Store
    metrics: Metrics
    monitor: Monitor
    replay: ReplaySaver
    hub: AgentHub
    control: ControlServer
    control_address: str
    runtime: Runtime  # the configured runtime: every job whose launcher is the in-process one
    torchrun: TorchrunRuntime  # the restart-based runtime of jobs whose launcher is ``torchrun``
    backend: SchedulerBackend
    scav: Scavenging

    def __init__(self, cfg: DaemonConfig, clock: Callable[[], float] = time.time,
                 parts: DaemonParts | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.parts = parts if parts is not None else DaemonParts()
        self.state_dir = cfg.state_path
        raise_nofile_limit()  # connection caps bind before the descriptor limit does
        try:
            self.state_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)  # private from the start: not "open"
            self._lock_fd = os.open(self.state_dir / "daemon.lock", os.O_CREAT | os.O_RDWR, 0o600)
        except OSError as exc:  # read-only, not ours, a file in the way
            raise DaemonError(f"state dir {self.state_dir}: cannot write to it ({exc.strerror or exc}); make it "
                              f"writable by uid {os.geteuid()} or set another state_dir") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DaemonError(f"another daemon runs on state dir {self.state_dir}") from None
        self.ctx = zmq.Context()
        try:
            self._open(cfg)
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Let go of what a construction that failed had taken: the metrics endpoint, the sockets' context
        and the state dir's lock (a later daemon can open it in this process)."""
        getattr(self, "metrics", Metrics()).close()
        self.ctx.destroy(linger=0)
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)

    @property
    def runtimes(self) -> Runtimes:
        return Runtimes(self.runtime, self.torchrun)

    def job_secret(self, job_id: str) -> str:
        """The job's report-signing secret, derived from the daemon's private key (nothing stored per job)."""
        return job_secret(self._monitor_key, job_id)

    def _open(self, cfg: DaemonConfig) -> None:
        self.store = Store.open(self.state_dir / STORE_FILE, clock=self.clock)
        self.metrics = Metrics(cfg.metrics.address)  # [metrics]: off (a no-op) unless an address is set
        stored = self.store.ports(("monitor", "agents", "rendezvous", "torchrun"))  # a bad entry: StoreError naming the file
        ports = {k: getattr(cfg.ports, k, 0) or port for k, port in stored.items()}
        parts = self.parts
        self.monitor = parts.monitor or Monitor(self._bind(ports["monitor"], "monitor"), ctx=self.ctx)
        self.replay = ReplaySaver(self.monitor, self.store)  # replay windows survive restarts (store meta)
        self.replay.load()
        self.hub = parts.hub or AgentHub(
            self._bind(ports["agents"], "agents"), dead_after_s=cfg.agent_dead_after, ctx=self.ctx, clock=self.clock,
            key_file=self.state_dir / AGENT_KEY_FILE,  # kept across restarts: agents outlive a daemon
        )
        self._monitor_key = load_master_key(self.state_dir / "monitor.key")
        self.runtime = parts.runtime or make_runtime(cfg, self.monitor.address, ports["rendezvous"])
        self.runtime.use_secrets(self.job_secret)  # each job's reports and store requests are signed with its own
        self.runtime.start()
        # the runtime of `launcher = "torchrun"` jobs: its store starts with its first job, on the port the last
        # daemon served it on (its agents come back there), and then its port is saved
        self.torchrun = TorchrunRuntime(host=cfg.ports.host, monitor=self.monitor.address, store_grace_s=cfg.store_grace,
                                        port=ports["torchrun"], on_start=self._save_ports)
        self.torchrun.use_secrets(self.job_secret)
        self._save_ports()
        self.backend = parts.backend or self._make_backend()
        self.scav = Scavenging(self.backend, self.hub, self.store.log_event,
                               nodes_per_pilot=self._scavenger().nodes_per_pilot if self._kind() != "local" else 1,
                               poll_interval=self._scavenger().poll_interval if self._kind() != "local" else 0.0,
                               # an agent that cannot reach us leaves after agent_dead_after: twice that
                               # without its hello, the pilot's node is broken
                               meta=self.store, agent_grace=2 * cfg.agent_dead_after,
                               workers_per_node=self._scavenger().slots_per_node)
        self.scav.resume()  # the pilots the last daemon left (still queued ones too) before anything new

    def open_control(self, handle: Callable[[Request, Caller], dict[str, Any]],
                     owner_of: Callable[[str], int | None]) -> None:
        """The control socket, its requests answered by ``handle`` (``owner_of``: a job's owner's uid)."""
        self.control = ControlServer(socket_path(self.state_dir), handle,
                                     admin_gids=admin_gids_from(list(self.cfg.admin_groups)),
                                     owner_of=owner_of, shared=os.geteuid() == 0)
        self.control_address = str(self.control.path)

    def killed_last_time(self) -> bool:
        """Whether the last daemon on this state dir was killed: a clean stop removes ``daemon.json`` and
        logs its stop, so either one left behind says so (``daemon.json`` may be gone after a kill -9)."""
        return (self.state_dir / STATE_FILE).exists() or self.store.last_daemon_was_killed()

    def close(self) -> None:
        """Close the scavenging, the runtimes, the sockets and the store; remove ``daemon.json``; let
        go of the state dir's lock."""
        self.scav.close()
        self.runtime.close()
        self.torchrun.close()
        self.store.log_event("daemon_stop", pid=os.getpid())
        self.replay.save()
        self.metrics.close()
        for sock in (self.monitor, self.hub):
            sock.close()
        self.control.close()
        self.ctx.term()
        self.store.close()
        try:
            (self.state_dir / STATE_FILE).unlink()
        except FileNotFoundError:
            pass
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)

    # ---------------------------------------------------------------- setup
    def _save_ports(self) -> None:
        """The ports this daemon serves on, for the next one (the torchrun launcher's once its store started)."""
        self.store.set_meta("ports", json.dumps({
            "monitor": port_of(self.monitor.address), "agents": port_of(self.hub.address),
            "rendezvous": int(self.runtime.port or 0), "torchrun": int(self.torchrun.port or 0),
        }))

    def _bind(self, port: int, what: str) -> str:
        """The address for ``what`` (``monitor``, ``agents``): ``port`` on ``[ports] host``, if free.

        A port set in ``[ports]`` is fixed: held by something else, the daemon refuses to start, naming it.
        A port of 0 floats: the last run's is preferred, else another is picked, logged as an error and a
        ``port_taken`` event (the last run's agents leave after ``agent_dead_after``)."""
        import socket

        host = url_host = "127.0.0.1" if self.cfg.ports.host == "localhost" else self.cfg.ports.host
        if not port:
            return f"tcp://{url_host}:0"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # closes at once (a zmq socket lingers)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as zmq binds
            try:
                probe.bind((host, port))
                probe.listen(1)
                return f"tcp://{url_host}:{port}"
            except OSError as exc:
                why = exc.strerror or str(exc)
        holder = port_holder(port)
        if getattr(self.cfg.ports, what, 0):
            raise DaemonError(f"{what} port {port} (ports.{what} in the config) is taken{holder}: {why}; "
                              f"refusing to start (stop that process, or set ports.{what} = 0 to let the port float)")
        log.error("%s port %d kept from the last run is taken%s; picking another (the last run's agents "
                  "cannot reach this daemon)", what, port, holder)
        self.store.log_event("port_taken", what=what, port=port, holder=holder.strip(" ()"))
        return f"tcp://{url_host}:0"

    def _scavenger(self) -> ScavengerConfig:
        """The [scavenger] table (a config without one: the defaults)."""
        return self.cfg.scavenger

    def _kind(self) -> str:
        """Which backend: [scavenger] kind, or the top-level ``backend`` when only that is set."""
        kind = self._scavenger().kind
        return kind if kind != "local" else self.cfg.backend

    def _make_backend(self) -> SchedulerBackend:
        """The configured :class:`scavenger.base.SchedulerBackend`: local, slurm or pbs."""
        kind = self._kind()
        if kind != "local":
            return self._make_batch_backend(kind)
        cfg = self.cfg
        stored = self.store.get_meta("local_epoch")
        epoch = float(stored) if stored else self.clock()
        if not stored:
            self.store.set_meta("local_epoch", repr(epoch))
        timeline = load_timeline(cfg)
        logs = str(self.state_dir / "logs")
        return LocalBackend(
            cfg.local.nodes, self.hub.address, timeline, cfg.local.time_scale, epoch=epoch, clock=self.clock,
            agent_args=("--heartbeat", f"{cfg.agent_heartbeat:g}", "--dead-after", f"{cfg.agent_dead_after:g}",
                        *self._key_args(), *self._warm_args(), *self._slots_args()),
            log_dir=logs,
        )

    def _key_args(self) -> tuple[str, ...]:
        """``--key-file PATH`` when the hub has an agent key (agents get its path, never the key)."""
        path = getattr(self.hub, "key_file", None)
        return ("--key-file", str(path)) if path else ()

    def _warm_args(self) -> tuple[str, ...]:
        """``--warm MODULES``: what the runtime's workers import, so agents prepare one ahead."""
        modules = tuple(self.runtime.warm_modules or ())
        return ("--warm", ",".join(modules)) if modules else ()

    def _slots_args(self) -> tuple[str, ...]:
        """``--slots K`` where ``[scavenger] workers_per_node`` is a number: agents prepare a warm process
        per slot from the start (a scheduler that reports the node's GPUs corrects it at the first start)."""
        slots = self._scavenger().slots_per_node
        return ("--slots", str(slots)) if slots is not None and slots > 1 and self.runtime.warm_modules else ()

    def _make_batch_backend(self, kind: str) -> SchedulerBackend:
        """Pilots as Slurm or PBS batch jobs; their agents connect to this daemon's hub."""
        sc = self._scavenger()
        logs = jobproc.private_dir(self.state_dir / "logs")  # 0700 (0711 for root), whatever the umask
        common: dict[str, Any] = dict(
            daemon_address=self.hub.address, walltime_s=sc.walltime, nodes_per_pilot=sc.nodes_per_pilot,
            max_pilots=sc.max_pilots, renew_before_s=sc.renew_before, max_queued_s=sc.max_queued,
            submit_rate=sc.submit_rate, command_timeout_s=sc.command_timeout,
            agent_args=("--heartbeat", f"{self.cfg.agent_heartbeat:g}", "--dead-after",
                        f"{self.cfg.agent_dead_after:g}", "--log-dir", str(logs), *self._key_args(),
                        *self._warm_args(), *self._slots_args()),
            account=sc.account or None,
        )
        if sc.job_name:
            common["job_name"] = sc.job_name
        try:
            if kind == "slurm":
                from scavenger.slurm import SlurmBackend, SlurmConfig

                return SlurmBackend(SlurmConfig(partition=sc.partition or None, qos=sc.qos or None,
                                                output=str(logs / "pilot-%j.out"), **common), clock=self.clock,
                                    runner=observed(run_command, self.metrics.observe_command))
            from scavenger.pbs import PbsBackend, PbsConfig

            return PbsBackend(PbsConfig(queue=sc.queue, output=str(logs / "pilot.out"), **common), clock=self.clock,
                              runner=observed(run_command, self.metrics.observe_command))
        except ValueError as exc:
            raise ConfigError(f"[scavenger]: {exc}") from None

    def write_state_file(self) -> None:
        info = {
            "pid": os.getpid(), "control": self.control_address, "agents": self.hub.address,
            "monitor": self.monitor.address, "store": str(self.state_dir / STORE_FILE),
        }
        write_private_file(self.state_dir / STATE_FILE, json.dumps(info).encode())


def port_holder(port: int) -> str:
    """`` (pid P, NAME, user U)`` of the process listening on TCP ``port``, when this user may see it."""
    import psutil

    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                if conn.pid is None:
                    return " (by a process of another user)"
                proc = psutil.Process(conn.pid)
                return f" (by pid {conn.pid}, {proc.name()}, user {proc.username()})"
    except (psutil.Error, OSError):
        pass
    return ""


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])
