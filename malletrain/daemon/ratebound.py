"""How much progress one job's own reports may claim, so that a job cannot inflate its own share.

Two bounds on the monitor's clock (never the sender's): an absolute one,
:data:`MAX_RATE_PER_NODE` samples/s per node the daemon gave the job (of ``max_nodes`` where it recorded no world) banked for :data:`CREDIT_WINDOW_S`, and,
once the job has a measured rate, :class:`HistoryBound`: ``factor`` times its best rate (or best
per-node rate times the world size it reports), the best rate rising at most ``growth`` per window
so a job cannot ratchet its own bound up. What a lying job can still do is in
docs/operators/security.md; it never moves another job's statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.messages import MAX_WORLD

MAX_RATE_PER_NODE = 1e6
"""Samples per second one node can train, at most (an ImageNet ResNet-50 node does ~10^4): a job's
reports may claim this much per node it was given per second of wall time, no more."""
CREDIT_WINDOW_S = 600.0
"""Unclaimed progress a job may bank (seconds at its absolute bound): a report after a long silence
is taken if it covers at most this long."""


@dataclass(frozen=True)
class HistoryBound:
    """The bound relative to a job's measured rate (see the module doc); ``factor`` 0 turns it off."""

    factor: float = 4.0
    """A report may claim up to this many times the job's best measured rate (or per-node rate x nodes)."""
    min_reports: int = 20
    """Accepted reports a measuring window needs before its rate counts."""
    min_seconds: float = 60.0
    """Seconds (monitor clock) a measuring window spans at least."""
    bank_s: float = 120.0
    """Seconds of the relative bound a job may bank: bursts of held reports up to ``factor`` x this long."""
    growth: float = 2.0
    """A measuring window raises the best rate by at most this factor."""

    def __post_init__(self) -> None:
        for name in ("factor", "min_seconds", "bank_s", "growth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"HistoryBound.{name} must be a finite number >= 0, got {value!r}")
        if 0 < self.factor < 1:
            raise ValueError(f"HistoryBound.factor must be 0 (off) or >= 1, got {self.factor!r}")
        if self.growth < 1:
            raise ValueError(f"HistoryBound.growth must be >= 1, got {self.growth!r}")
        if isinstance(self.min_reports, bool) or not isinstance(self.min_reports, int) or self.min_reports < 2:
            raise ValueError(f"HistoryBound.min_reports must be an integer >= 2, got {self.min_reports!r}")


@dataclass
class _Window:
    """Accepted reports since ``start``: samples after the first, and node-seconds they took."""

    start: float
    at: float
    samples: int = 0
    node_s: float = 0.0
    reports: int = 1


@dataclass
class ClaimBound:
    """One job's two bounds and what it has shown (kept by the monitor's ``JobStats``)."""

    credit_at: float
    max_nodes: int = MAX_WORLD
    max_rate_per_node: float = MAX_RATE_PER_NODE
    history: HistoryBound = field(default_factory=HistoryBound)
    credit: float = 0.0
    best_per_node: float = 0.0
    """The job's best measured rate, samples per second per node (0: no history yet)."""
    best_rate: float = 0.0
    """The job's best measured rate, samples per second on all its nodes."""
    rel_credit: float = 0.0
    rel_credit_at: float = 0.0
    window: _Window | None = None

    def refusal(self, samples: int, world_size: int, now: float, given: bool = False) -> str | None:
        """Take ``samples`` claimed at ``now`` on ``world_size`` nodes if both bounds allow it (None);
        else why not, with nothing changed. With ``given`` (``world_size`` is the daemon's record of the
        nodes it gave the job) the absolute bound is per node of ``world_size``, not of ``max_nodes``: a
        job on one node claims no more than one node trains, from its first report on."""
        nodes = min(max(1, world_size), self.max_nodes)
        rate = self.max_rate_per_node * (nodes if given else self.max_nodes)
        credit = min(rate * CREDIT_WINDOW_S, self.credit + rate * max(0.0, now - self.credit_at))
        if samples > credit:
            return f"{samples} samples claimed on {nodes} node(s), more than they could train ({rate:g}/s at most)"
        rel = 0.0
        if self.best_per_node > 0 and self.history.factor > 0:
            rel_rate = self.history.factor * max(self.best_rate, self.best_per_node * nodes)
            rel = min(rel_rate * self.history.bank_s, self.rel_credit + rel_rate * max(0.0, now - self.rel_credit_at))
            if samples > rel:
                return (f"{samples} samples claimed on {nodes} node(s), more than {self.history.factor:g}x its "
                        f"measured rate allows ({self.best_rate:.4g}/s, {self.best_per_node:.4g}/s per node)")
            self.rel_credit, self.rel_credit_at = rel - samples, now
        self.credit, self.credit_at = credit - samples, now
        self._measure(samples, nodes, now)
        return None

    def _measure(self, samples: int, nodes: int, now: float) -> None:
        win = self.window
        if win is None:  # the first report opens a window: its samples were trained before it
            self.window = _Window(now, now)
            return
        win.node_s += nodes * max(0.0, now - win.at)
        win.at = now
        win.samples += samples
        win.reports += 1
        if win.reports < self.history.min_reports or now - win.start < self.history.min_seconds or win.node_s <= 0:
            return
        per_node, rate = win.samples / win.node_s, win.samples / (now - win.start)
        if self.best_per_node == 0:  # history from now on, with a full bank
            self.best_per_node, self.best_rate = per_node, rate
            self.rel_credit = self.history.factor * max(rate, per_node * nodes) * self.history.bank_s
            self.rel_credit_at = now
        else:
            growth = self.history.growth
            self.best_per_node = max(self.best_per_node, min(per_node, self.best_per_node * growth))
            self.best_rate = max(self.best_rate, min(rate, self.best_rate * growth))
        self.window = _Window(now, now)
