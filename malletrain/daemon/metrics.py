"""Prometheus metrics of the daemon (``prometheus-client``; off unless ``[metrics] address`` is set).

The daemon calls one :class:`Metrics` method per thing it observes; with metrics off every method
returns at once and nothing is imported, bound or counted. Each :class:`Metrics` has its own
``CollectorRegistry`` (no global state: a test may run several daemons). The served metrics are
listed in docs/operators/operations.md. Label values come from the daemon's own ids (job ids,
command names), never from what a sender wrote in a frame."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

DEFAULT_HOST = "127.0.0.1"
DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
COMMAND_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
NODE_STATES = ("idle", "held", "used")


class MetricsError(ValueError):
    """Metrics cannot be served as configured; the message says why (printed without a traceback)."""


class MetricsAddressError(MetricsError):
    """A ``[metrics] address`` that is not ``host:port`` or cannot be bound; the message names it."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str) -> Endpoint:
    """``host:port``, ``[v6]:port``, ``:port`` or ``port`` (host 127.0.0.1; port 0: a free one); the host must
    be an IP address or ``localhost`` (a name would make the bound interface depend on DNS)."""
    raw = text.strip()
    if not raw:
        raise MetricsAddressError("metrics.address is empty")
    if raw.startswith("["):
        host, sep, port = raw[1:].partition("]:")
        if not sep:
            raise MetricsAddressError(f"metrics.address {text!r}: expected [ipv6]:port")
    elif raw.count(":") == 1:
        host, _, port = raw.partition(":")
    elif ":" not in raw:
        host, port = "", raw
    else:
        raise MetricsAddressError(f"metrics.address {text!r}: an IPv6 host goes in brackets, [::1]:9464")
    host = host or DEFAULT_HOST
    if not port.isascii() or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise MetricsAddressError(f"metrics.address {text!r}: port must be an integer in [0, 65535]")
    if host != "localhost":
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise MetricsAddressError(f"metrics.address {text!r}: host must be an IP address or localhost") from None
        if ip.is_unspecified:  # as ports.host: the metrics name every job and its owner's rates
            raise MetricsAddressError(f"metrics.address {text!r} listens on every network; give the address "
                                      "of the one the scraper uses")
        host = str(ip)
    return Endpoint(host, int(port))


class Metrics:
    """What the daemon exports; ``Metrics(None)`` (or ``""``) is the no-op used when metrics are off."""

    def __init__(self, address: str | None = None) -> None:
        self.endpoint: Endpoint | None = None
        self._server: Any = None
        self._thread: Any = None
        self._on = bool(address)
        self._seen: dict[str, int] = {}
        self._jobs_shown: set[str] = set()
        if self._on:
            assert address is not None
            self._start(parse_address(address))

    @property
    def enabled(self) -> bool:
        return self._on

    @property
    def address(self) -> str:
        """``host:port`` actually served (the real port when 0 was configured); "" when off."""
        return str(self.endpoint) if self.endpoint is not None else ""

    def _start(self, ep: Endpoint) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
            from prometheus_client import make_wsgi_app
        except ImportError:
            raise MetricsError("[metrics] address is set but prometheus-client is not installed: "
                               "pip install 'malletrain[metrics]'") from None

        reg = self.registry = CollectorRegistry(auto_describe=True)
        p = "malletrain_"
        self.nodes = Gauge(p + "nodes", "Nodes by state (idle: free on the machine; held: our pilots; used: "
                           "in a job's member list)", ["state"], registry=reg)
        self.jobs = Gauge(p + "jobs", "Live jobs by state", ["state"], registry=reg)
        self.ended = Counter(p + "jobs_ended", "Jobs that ended, by final state", ["state"], registry=reg)
        self.throughput = Gauge(p + "job_throughput_samples_per_second", "Measured samples/s of a running job "
                                "at its current size", ["job"], registry=reg)
        self.job_nodes = Gauge(p + "job_nodes", "Nodes in a live job's member list", ["job"], registry=reg)
        self.rescales = Counter(p + "rescales", "Measured rescales", ["kind"], registry=reg)
        self.pause = Counter(p + "rescale_pause_seconds", "Seconds of training paused by rescales",
                             ["kind"], registry=reg)
        self.decision = Histogram(p + "decision_seconds", "Time of one policy decision",
                                  buckets=DECISION_BUCKETS, registry=reg)
        self.received = Counter(p + "reports_received", "Frames the job monitor read", registry=reg)
        self.accepted = Counter(p + "reports_accepted", "Reports the job monitor accepted", registry=reg)
        self.rejected = Counter(p + "reports_rejected", "Frames the job monitor rejected, by reason",
                                ["reason"], registry=reg)
        self.commands = Counter(p + "scheduler_commands", "Scheduler commands run, by result",
                                ["command", "result"], registry=reg)
        self.command_seconds = Histogram(p + "scheduler_command_seconds", "Wall time of scheduler commands",
                                         ["command"], buckets=COMMAND_BUCKETS, registry=reg)
        ProcessCollector(registry=reg)  # process_cpu_seconds_total, process_resident_memory_bytes, open fds
        for s in NODE_STATES:
            self.nodes.labels(s).set(0)
        try:
            from malletrain.daemon.metrics_server import serve_metrics  # a thread per request, within shares

            self._server, self._thread = serve_metrics(ep.host, ep.port, make_wsgi_app(reg))
        except OSError as exc:
            raise MetricsAddressError(f"metrics.address {ep}: cannot serve metrics there: "
                                      f"{exc.strerror or exc}") from None
        self.endpoint = Endpoint(ep.host, int(self._server.server_address[1]))

    # ---------------------------------------------------------------- what the daemon calls
    def observe_decision(self, seconds: float) -> None:
        if self._on:
            self.decision.observe(max(0.0, seconds))

    def observe_nodes(self, idle: int, held: int, used: int) -> None:
        if self._on:
            for state, n in zip(NODE_STATES, (idle, held, used)):
                self.nodes.labels(state).set(n)

    def observe_runs(self, runs: Iterable[Any], monitor: Any) -> None:
        """Jobs by state, each live job's nodes and measured rate (``runs``: the daemon's ``JobRun``s)."""
        if not self._on:
            return
        by_state: dict[str, int] = {}
        shown: set[str] = set()
        stats_of = getattr(monitor, "jobs", {})
        for run in runs:
            state = run.state.value
            by_state[state] = by_state.get(state, 0) + 1
            if run.state.terminal:
                continue
            shown.add(run.id)
            self.job_nodes.labels(run.id).set(len(run.members))
            self.throughput.labels(run.id).set(_rate(stats_of.get(run.id), bool(run.members)))
        from malletrain.daemon.jobspec import JobState

        for state in JobState:
            if not state.terminal:
                self.jobs.labels(state.value).set(by_state.get(state.value, 0))
        for gone in self._jobs_shown - shown:  # a job that ended leaves no stale series behind
            for g in (self.job_nodes, self.throughput):
                try:
                    g.remove(gone)
                except KeyError:
                    pass
        self._jobs_shown = shown

    def observe_state(self, state: Any) -> None:
        """A job moved to ``state`` (a :class:`~malletrain.daemon.jobspec.JobState`); ends are counted."""
        if self._on and state.terminal:
            self.ended.labels(state.value).inc()

    def observe_rescale(self, kind: str, pause_s: float) -> None:
        if self._on:
            self.rescales.labels(kind).inc()
            self.pause.labels(kind).inc(max(0.0, pause_s))

    def observe_monitor(self, monitor: Any) -> None:
        """The monitor's cumulative counts (:meth:`malletrain.daemon.monitor.Monitor.counts`) as counters."""
        if not self._on:
            return
        counts: Mapping[str, int] = monitor.counts()
        for key, value in counts.items():
            delta = int(value) - self._seen.get(key, 0)
            if delta <= 0:
                continue
            self._seen[key] = int(value)
            if key == "received":
                self.received.inc(delta)
            elif key == "accepted":
                self.accepted.inc(delta)
            elif key != "rejected":
                self.rejected.labels(key).inc(delta)

    def observe_command(self, argv: tuple[str, ...], seconds: float, result: str) -> None:
        """One scheduler command (the hook of :func:`scavenger.base.observed`): ``result`` ok | failed | timeout."""
        if self._on:
            name = os.path.basename(argv[0]) if argv else "?"
            self.commands.labels(name, result).inc()
            self.command_seconds.labels(name).observe(max(0.0, seconds))

    def close(self) -> None:
        """Stop serving; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None


def _rate(stats: Any, running: bool) -> float:
    if stats is None or not running or not getattr(stats, "world_size", 0):
        return 0.0
    est = stats.throughput.estimate(stats.world_size)
    return float(est.rate) if est is not None else 0.0
