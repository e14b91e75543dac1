"""Which collectives a world uses, and where a worker process sits in it (pure: no torch calls).

The member list names one worker per node of K processes: local rank ``l`` of the ``g``-th member
is rank ``g x K + l``, numbered node by node as ``torchrun`` does.
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

from contract.workerenv import RankPlace, WorkerEnvError


def collective_backend(device_type: str, available: Collection[str]) -> str:
    """The process-group backend for tensors on ``device_type`` (``cuda``, ``xpu``, ``cpu``, ...),
    given the backends this torch build has (``available``)."""
    if device_type == "cuda" and "nccl" in available:
        return "nccl"
    if device_type == "xpu" and "xccl" in available:
        return "xccl"
    return "gloo"


def local_slot(env: Mapping[str, str]) -> tuple[int, int]:
    """``(local_rank, local_world_size)`` from ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (both unset: (0, 1));
    :class:`WorkerEnvError` names a bad value."""
    rank_text, size_text = env.get("LOCAL_RANK"), env.get("LOCAL_WORLD_SIZE")
    if not size_text:
        return 0, 1
    try:
        rank, size = int(rank_text or "0"), int(size_text)
    except ValueError:
        raise WorkerEnvError(f"LOCAL_RANK={rank_text!r}, LOCAL_WORLD_SIZE={size_text!r}: not integers") from None
    if not 0 <= rank < size:
        raise WorkerEnvError(f"LOCAL_RANK={rank} not in [0, LOCAL_WORLD_SIZE={size})")
    return rank, size


def place_in(members: Sequence[str], worker: str, local_rank: int, local_world_size: int) -> RankPlace:
    """Where local rank ``local_rank`` of member ``worker`` sits in the world of ``members``."""
    return RankPlace(members.index(worker), len(members), local_rank, local_world_size)
