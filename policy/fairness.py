"""Fair share between users: who may hold how many nodes while other users have work.

The held nodes are shared between users with admitted work by weighted max-min (water-filling), never more than
a user's jobs can use (their believed knee), so the shares never leave a node idle; a user's share is split
evenly between its jobs. The shares bind as per-job maxima handed to the exact allocator (it stays exact), and
only once a user has held less than its share for ``fair_wait_s``: from then until that user's work is done (no
back and forth). The rule for operators: docs/operators.md (fair share between users).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from policy.config import Fairness, PolicyConfig
from policy.model import JobView
from policy.state import PolicyState


def water_fill(total: int, demand: Mapping[str, int], weight: Mapping[str, float]) -> dict[str, int]:
    """Weighted max-min integer shares of ``total`` nodes: each key at most its ``demand``, in proportion to
    ``weight`` (default 1); the floors, then the nodes left one each by the largest fraction (ties: ``demand``'s
    order)."""
    keys = [k for k, d in demand.items() if d > 0]
    out = {k: 0 for k in demand}
    if sum(demand[k] for k in keys) <= total:
        out.update({k: demand[k] for k in keys})
        return out
    w = {k: float(weight.get(k, 1.0)) for k in keys}
    left, wsum = float(max(0, total)), sum(w.values())
    frac: dict[str, float] = {}
    by_level = sorted(keys, key=lambda k: demand[k] / w[k])
    for i, k in enumerate(by_level):
        level = left / wsum if wsum > 0 else 0.0
        if demand[k] <= w[k] * level:
            frac[k] = float(demand[k])
            left -= demand[k]
            wsum -= w[k]
            continue
        for k2 in by_level[i:]:
            frac[k2] = w[k2] * level
        break
    rank = {k: i for i, k in enumerate(keys)}
    whole = {k: min(demand[k], int(math.floor(frac[k] + 1e-9))) for k in keys}
    rest = max(0, total) - sum(whole.values())
    for k in sorted(keys, key=lambda k: (-(frac[k] - whole[k]), rank[k])):
        if rest <= 0:
            break
        if whole[k] < demand[k]:
            whole[k] += 1
            rest -= 1
    out.update(whole)
    return out


def user_shares(jobs: Sequence[JobView], demand: Mapping[str, int], total: int, weights: Mapping[str, float]
                ) -> dict[str, int]:
    """Each user's share of ``total`` nodes (``weights``, 1 if not named); ``demand``: what each job can use."""
    want: dict[str, int] = {}
    for j in jobs:
        want[j.user] = want.get(j.user, 0) + demand[j.id]
    return water_fill(total, want, {u: weights.get(u, 1.0) for u in want})


def job_shares(jobs: Sequence[JobView], demand: Mapping[str, int], total: int, weights: Mapping[str, float]
               ) -> dict[str, int]:
    """Each job's share of ``total`` nodes: the users' shares, each split evenly between the user's jobs."""
    by_user: dict[str, list[JobView]] = {}
    for j in jobs:
        by_user.setdefault(j.user, []).append(j)
    users = user_shares(jobs, demand, total, weights)
    out: dict[str, int] = {}
    for u, js in by_user.items():
        out.update(water_fill(users[u], {j.id: demand[j.id] for j in js}, {}))
    return out


def fair_caps(cfg: PolicyConfig, st: PolicyState, admitted: Sequence[JobView], demand: Mapping[str, int],
              total: int, now: float) -> tuple[dict[str, int], float | None]:
    """The most nodes each admitted job may get in this decision (empty: the shares do not bind), and when a
    waiting user's ``fair_wait_s`` runs out (None: never); updates ``st.fair_since`` and ``st.fair_for``."""
    users = {j.user for j in admitted}
    if cfg.fairness is Fairness.NONE or len(users) < 2:
        st.fair_since.clear()
        st.fair_for.clear()
        return {}, None
    st.fair_for.intersection_update(users)
    held: dict[str, int] = {}
    for j in admitted:
        held[j.user] = held.get(j.user, 0) + j.count
    share = user_shares(admitted, demand, total, cfg.weight_of)
    for u in list(st.fair_since):
        if u not in users or held[u] >= share[u] or u in st.fair_for:
            del st.fair_since[u]
    for u in sorted(users):
        if held[u] < share[u] and u not in st.fair_for:
            since = st.fair_since.setdefault(u, now)
            if now - since >= cfg.fair_wait_s:
                st.fair_for.add(u)
                del st.fair_since[u]
    wake = min((s + cfg.fair_wait_s for s in st.fair_since.values()), default=None)
    if not st.fair_for:
        return {}, wake
    shares = job_shares(admitted, demand, total, cfg.weight_of)
    # what no user's jobs can use (every demand met) may go to any job: shares never leave a node idle
    spare = max(0, total - sum(shares.values()))
    # a job whose min is above its share still runs at its min, but one whose share is none (its user's
    # share went to the user's earlier jobs: an array's elements, a sweep's trials) gets no node
    return {j.id: 0 if shares[j.id] + spare == 0 else max(shares[j.id] + spare, j.min_nodes) for j in admitted}, wake
