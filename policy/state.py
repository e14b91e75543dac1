"""The state the policy keeps between decisions: a rule's memory, never a cache, saved by the daemon after each
decision that changed it so a restart resumes profiles, debts and learned curves."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from profiler.jpa import ProfileSession, ProfilingError

STATE_VERSION = 1
POPULATION_KEEP = 256  # per-node rates of finished jobs kept for the linear fallback
SHAPES_KEEP = 64  # curve shapes of finished jobs kept for the pooled population prior
FRAGMENTS_KEEP = 4096  # idle-fragment lengths kept for the learned horizon


class PolicyStateError(ValueError):
    """A saved policy state that cannot be read; the message says what is wrong."""


@dataclass(frozen=True)
class Debt:
    """A profiling job owes ``nodes`` nodes to ``lender``, which may shrink but not grow until repaid."""

    lender: str
    nodes: int


@dataclass
class PolicyState:
    admitted: list[str] = field(default_factory=list)  # Pjmax slots, in admission order
    queue_front: list[str] = field(default_factory=list)  # preempted jobs: re-admitted first, in order
    assigned: dict[str, int] = field(default_factory=dict)  # counts given at the last decision
    profiles: dict[str, ProfileSession] = field(default_factory=dict)
    profiled: set[str] = field(default_factory=set)  # profiled (or cut short): never profiled again
    cut_short: set[str] = field(default_factory=set)  # a gated probe cut short once, unmeasured: tried again once
    debts: dict[str, Debt] = field(default_factory=dict)  # borrower -> what it owes
    lent_at: dict[str, float] = field(default_factory=dict)  # when each job last lent nodes
    measured: dict[str, dict[int, float]] = field(default_factory=dict)  # accepted points per live job
    population: list[float] = field(default_factory=list)  # per-node rates of jobs that left
    shapes: list[dict[int, float]] = field(default_factory=list)  # of jobs that left: {count: efficiency vs the least}
    fragments: list[float] = field(default_factory=list)  # lengths (s) of idle fragments that ended
    over_budget: set[str] = field(default_factory=set)  # jobs stopped for spending their budget
    fair_since: dict[str, float] = field(default_factory=dict)  # user -> since when it held less than its share
    fair_for: set[str] = field(default_factory=set)  # users whose wait made every job be held to its share

    def restart_profile(self, job: str) -> int | None:
        """Drop ``job``'s profile that a clean stop of the daemon interrupted (else the next decision would read it
        at 0 nodes as preempted and end it for good): no debt, back to the queue's front, profiled afresh when
        placed. Returns the count the profile was at, or None if it had none."""
        session = self.profiles.pop(job, None)
        if session is None:
            return None
        self.debts.pop(job, None)
        if job in self.admitted:
            self.admitted.remove(job)
        self.assigned.pop(job, None)
        if job not in self.queue_front:
            self.queue_front.append(job)
        return session.count

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "version": STATE_VERSION,
            "admitted": self.admitted,
            "queue_front": self.queue_front,
            "assigned": self.assigned,
            # a list, not an object: sort_keys would reorder it, and the order profiles started in is
            # the order the policy steps them in (and reports them in ``Decision.watch``)
            "profiles": [[k, s.to_dict()] for k, s in self.profiles.items()],
            "profiled": sorted(self.profiled),
            "cut_short": sorted(self.cut_short),
            "debts": {k: [d.lender, d.nodes] for k, d in self.debts.items()},
            "lent_at": self.lent_at,
            "measured": {k: {str(n): r for n, r in pts.items()} for k, pts in self.measured.items()},
            "population": self.population,
            "shapes": [{str(n): e for n, e in sorted(sh.items())} for sh in self.shapes],
            "fragments": self.fragments,
            "over_budget": sorted(self.over_budget),
            "fair_since": self.fair_since,
            "fair_for": sorted(self.fair_for),
        }
        return json.dumps(data, sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "PolicyState":
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise PolicyStateError("saved policy state is not a JSON object")
            if data.get("version") != STATE_VERSION:
                raise PolicyStateError(f"saved policy state has version {data.get('version')!r}, "
                                       f"this malletrain reads {STATE_VERSION}")
            st = cls(
                admitted=[str(x) for x in data["admitted"]],
                queue_front=[str(x) for x in data["queue_front"]],
                assigned={str(k): int(v) for k, v in data["assigned"].items()},
                profiles={str(k): ProfileSession.from_dict(v) for k, v in _pairs(data["profiles"])},
                profiled={str(x) for x in data["profiled"]},
                cut_short={str(x) for x in data.get("cut_short", [])},  # absent from states saved before it
                debts={str(k): Debt(str(v[0]), int(v[1])) for k, v in data["debts"].items()},
                lent_at={str(k): float(v) for k, v in data["lent_at"].items()},
                measured={str(k): {int(n): float(r) for n, r in pts.items()} for k, pts in data["measured"].items()},
                population=[float(x) for x in data["population"]][-POPULATION_KEEP:],
                # absent from states saved before node shapes and fragments were kept
                shapes=[{int(n): float(e) for n, e in sh.items()} for sh in data.get("shapes", [])][-SHAPES_KEEP:],
                fragments=[float(x) for x in data.get("fragments", [])][-FRAGMENTS_KEEP:],
                over_budget={str(x) for x in data.get("over_budget", [])},
                # absent from states saved before fair share
                fair_since={str(k): float(v) for k, v in data.get("fair_since", {}).items()},
                fair_for={str(x) for x in data.get("fair_for", [])},
            )
        except PolicyStateError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, ProfilingError) as exc:
            raise PolicyStateError(f"saved policy state is malformed: {type(exc).__name__}: {exc}") from None
        for job, pts in st.measured.items():
            for n, r in pts.items():
                if n < 1 or not math.isfinite(r) or r <= 0:
                    raise PolicyStateError(f"saved policy state: job {job} has a bad point ({n}, {r})")
        for sh in st.shapes:
            if any(n < 1 or not math.isfinite(e) or e <= 0 for n, e in sh.items()):
                raise PolicyStateError(f"saved policy state: a bad population shape {sh}")
        if any(not math.isfinite(x) or x < 0 for x in st.fragments):
            raise PolicyStateError("saved policy state: a bad idle-fragment length")
        return st


def _pairs(value: Any) -> list[Any]:
    """``[[key, value], ...]``; an object (as version 1 states first saved profiles) reads as its items."""
    return list(value.items()) if isinstance(value, dict) else [(k, v) for k, v in value]
