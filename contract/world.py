"""A ``torchrun`` job's world: what the daemon publishes in its store and every rank agent reads.

The daemon's ``torchrun`` runtime writes each world (``mt/<job>/world/<g>``: its restart count and
every rank's place) and the rank agents on the nodes read it: ranks are numbered node by node from
the job's ordered nodes and the K ranks on each (:func:`rank_names`, :func:`rank_places`), as
``torchrun`` numbers them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from contract.workerenv import RankPlace, WorkerEnvError

WORKERS_PER_NODE_MAX = 1024
"""No node has more accelerators (worker slots) than this."""
TORCHRUN_MAX_RANKS = 8192
"""Ranks a ``torchrun`` job's world may have at most (``max_nodes`` x ``workers_per_node``): its rank
places go to every rank agent as one value of the daemon's store, which carries at most one 1 MiB frame."""
DEFAULT_STOP_GRACE_S = 10.0
"""Seconds a rank has after SIGTERM (at a change of its world) before SIGKILL."""
DEFAULT_FAILURE_WAIT_S = 20.0
"""After its command failed, how long a rank agent waits for a newer world (a peer recalled: the daemon
publishes the world without it) before the failure counts; not at all once every rank of the world has
failed (a script that crashes at start: no newer world helps)."""


def rank_names(worker: str, local_ranks: int) -> list[str]:
    """The names of ``worker``'s ranks in a world's places: the worker itself where it runs one rank,
    else ``WORKER/0`` .. ``WORKER/K-1`` (``/`` is never part of a worker id), its local ranks in order."""
    if local_ranks < 1:
        raise ValueError(f"worker {worker}: {local_ranks} local ranks, need at least 1")
    return [worker] if local_ranks == 1 else [f"{worker}/{i}" for i in range(local_ranks)]


def rank_places(members: Sequence[tuple[str, str]]) -> dict[str, RankPlace]:
    """Each worker's place from ``(worker, node)`` pairs in the job's order: nodes are numbered in the
    order they first appear (``GROUP_RANK``), a node's workers in their order (``LOCAL_RANK``), and
    every node runs the same number of workers (torchrun's ``--nproc-per-node``); ``ValueError``
    names the nodes otherwise."""
    by_node: dict[str, list[str]] = {}
    for worker, node in members:
        by_node.setdefault(node, []).append(worker)
    sizes = {node: len(workers) for node, workers in by_node.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"a torchrun world runs the same number of workers on every node, got {sizes}")
    groups = list(by_node.values())
    return {worker: RankPlace(g, len(groups), local, len(workers))
            for g, workers in enumerate(groups) for local, worker in enumerate(workers)}


@dataclass(frozen=True)
class World:
    """One world of a restarted job, as the daemon publishes it: its restart count and every rank's place."""

    restart_count: int
    places: dict[str, RankPlace]

    def to_json(self) -> str:
        return json.dumps({"restart_count": self.restart_count,
                           "places": {w: [p.group_rank, p.group_world_size, p.local_rank, p.local_world_size]
                                      for w, p in self.places.items()}})

    @classmethod
    def parse(cls, raw: bytes | str, where: str) -> World:
        """The world stored at ``where`` (a store key); ``ValueError`` naming it if malformed."""
        try:
            obj = json.loads(raw)
            count = obj["restart_count"]
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"restart_count {count!r} is not an integer >= 0")
            places = {str(w): RankPlace(*(int(x) for x in p)) for w, p in obj["places"].items()}
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError,
                WorkerEnvError, ValueError) as exc:
            raise ValueError(f"{where}: not a torchrun world: {exc}") from None
        return cls(count, places)
