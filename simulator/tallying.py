"""The replay's node-second integrals between events, split by whether the admitted jobs could absorb every idle node
(the *constrained* period) or not. Nothing changes between two events, so each interval is accounted once, at the next
event, from the ledger's counts and the admitted jobs' rates, into a :class:`simulator.summary.Tally`."""

from __future__ import annotations

from policy import Ledger
from simulator.fleet import Fleet
from simulator.summary import Tally


class Tallying:
    """Integrates the ledger's node counts and the admitted jobs' work into ``tally`` as time passes."""

    def __init__(self, ledger: Ledger, fleet: Fleet, start: float) -> None:
        self._ledger = ledger
        self._fleet = fleet
        self.tally = Tally()
        self._last_t = start

    def period(self) -> int:
        """0 while the admitted jobs could absorb every idle node (constrained), else 1."""
        return 0 if self._ledger.n_idle <= self._fleet.absorb_capacity() else 1

    def integrate(self, t: float) -> None:
        """Account ``[last, t)``, over which nothing changes (every change happens at an event time)."""
        last = self._last_t
        dt = t - last
        if dt > 0:
            ledger, tally = self._ledger, self.tally
            n_idle = ledger.n_idle
            held = ledger.n_usable
            used = held - ledger.n_free
            tally.idle_node_seconds += n_idle * dt
            tally.held_node_seconds += held * dt
            tally.used_node_seconds += used * dt
            capacity = self._fleet.absorb_capacity()
            k = 0 if n_idle <= capacity else 1
            tally.split_seconds[k] += dt
            tally.split_idle[k] += n_idle * dt
            tally.split_used[k] += used * dt
            tally.split_work[k] += self._work_between(last, t)
            tally.excess_node_seconds += max(0, n_idle - capacity) * dt
            self._last_t = t

    def _work_between(self, t0: float, t1: float) -> float:
        """Model-neutral work (node-seconds at one node) the admitted jobs do over ``[t0, t1)``."""
        work = 0.0
        for job in self._fleet.admitted:
            rate = job.rate
            if rate > 0:  # a job on no nodes has rate 0
                r1 = job.one_node_rate
                if r1 > 0:
                    paused = job.paused_until
                    busy = t1 - (paused if paused > t0 else t0)
                    work += rate / r1 * (busy if busy > 0.0 else 0.0)
        return work
