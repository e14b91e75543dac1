"""Each worker slot's own part of a node: its device, its share of the cores, its local rank.

Each of a worker's K processes sees only its slot: its device (``CUDA_VISIBLE_DEVICES``,
``ROCR_VISIBLE_DEVICES`` or ``ZE_AFFINITY_MASK``, so device 0 is its own; or, where the job sees
every device, ``LOCAL_RANK`` is the index), cores / K cores of affinity with ``OMP_NUM_THREADS`` to
match unless the job sets it (K pools of every core would oversubscribe), and ``LOCAL_RANK`` /
``LOCAL_WORLD_SIZE``. Both spawners use :func:`slot_place`; pure, so tested without a GPU.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

MAX_SLOTS = 64
"""The most worker slots one node may have (a sanity bound on what a scheduler reports)."""


class NodeShapeError(ValueError):
    """A node shape (a scheduler's reply, a config value) that cannot be used; the message names it."""


class Accelerator(enum.Enum):
    """The kind of accelerator a node has, by the variable that hides its devices from a process."""

    CUDA = "cuda"
    """NVIDIA: ``CUDA_VISIBLE_DEVICES``."""
    ROCM = "rocm"
    """AMD: ``ROCR_VISIBLE_DEVICES``."""
    XPU = "xpu"
    """Intel: ``ZE_AFFINITY_MASK``."""
    NONE = "none"
    """No accelerator: the slots share nothing but the cores."""

    @property
    def variable(self) -> str | None:
        """The variable that names the devices a process sees (None: no accelerator)."""
        return _DEVICE_VARIABLE[self]


_DEVICE_VARIABLE: dict[Accelerator, str | None] = {
    Accelerator.CUDA: "CUDA_VISIBLE_DEVICES",
    Accelerator.ROCM: "ROCR_VISIBLE_DEVICES",
    Accelerator.XPU: "ZE_AFFINITY_MASK",
    Accelerator.NONE: None,
}

DEVICE_VARIABLES: tuple[str, ...] = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


# ---------------------------------------------------------------- each slot's part
def detect_accelerator(env: Mapping[str, str], dev_names: Iterable[str]) -> Accelerator:
    """The node's accelerator from what the agent sees: a device variable its pilot was given
    (the scheduler's choice of devices), else the device files under ``/dev``."""
    for acc in (Accelerator.ROCM, Accelerator.XPU, Accelerator.CUDA):
        if env.get(acc.variable or ""):
            return acc
    names = set(dev_names)
    if any(n.startswith("nvidia") and n[6:].isdigit() for n in names):
        return Accelerator.CUDA
    if "kfd" in names:
        return Accelerator.ROCM
    if "dri" in names and any(n.startswith("accel") for n in names):
        return Accelerator.XPU
    return Accelerator.NONE


def local_device_count(acc: Accelerator, env: Mapping[str, str], dev_names: Iterable[str]) -> int:
    """How many devices the agent sees: the entries of its device variable (what the pilot was given),
    else NVIDIA's ``/dev/nvidiaN`` files, else 1 (an agent's first guess at K, before the daemon's word)."""
    var = acc.variable
    listed = [d for d in env.get(var, "").split(",") if d.strip()] if var else []
    if listed:
        return min(len(listed), MAX_SLOTS)
    if acc is Accelerator.CUDA:
        return max(1, min(sum(1 for n in dev_names if n.startswith("nvidia") and n[6:].isdigit()), MAX_SLOTS))
    return 1


def visible_devices(acc: Accelerator, env: Mapping[str, str], slots: int) -> tuple[str, ...]:
    """The device names the node gave the pilot (its variable, comma-separated), else 0 .. K-1."""
    var = acc.variable
    given = env.get(var, "") if var else ""
    listed = tuple(d.strip() for d in given.split(",") if d.strip())
    return listed or tuple(str(i) for i in range(slots))


def core_share(cores: Sequence[int], local_rank: int, slots: int) -> tuple[int, ...]:
    """Slot ``local_rank``'s cores: the ``local_rank``-th of ``slots`` contiguous, equal parts of
    ``cores`` (sorted; the remainder goes to the first slots). A node with fewer cores than
    slots gives every slot one core, shared round-robin."""
    ordered = sorted(cores)
    if not ordered:
        return ()
    if len(ordered) < slots:
        return (ordered[local_rank % len(ordered)],)
    base, extra = divmod(len(ordered), slots)
    start = local_rank * base + min(local_rank, extra)
    return tuple(ordered[start:start + base + (1 if local_rank < extra else 0)])


ENV_LOCAL_RANKS = "MALLETRAIN_LOCAL_RANKS"
"""K, given by the node agent to a worker's one process that starts its K ranks itself (the ``torchrun``
launcher's rank agent); the processes the agent starts one per slot learn K from ``LOCAL_WORLD_SIZE``."""

ENV_DEVICES = "MALLETRAIN_DEVICES"
"""A job variable: ``own`` (the default: each worker sees its slot's device only) or ``all``
(every worker sees every device of the node and uses ``LOCAL_RANK`` as its index)."""
DEVICES_OWN = "own"
DEVICES_ALL = "all"


def _world_ranks(local_rank: int, slots: int, job_env: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE and the role's of local rank ``local_rank`` where ``job_env`` names the node's
    place in its world (GROUP_RANK, GROUP_WORLD_SIZE); {} where it does not."""
    group, groups = job_env.get("GROUP_RANK"), job_env.get("GROUP_WORLD_SIZE")
    if group is None or groups is None:
        return {}
    try:
        g, n = int(group), int(groups)
    except ValueError:
        raise NodeShapeError(f"GROUP_RANK={group!r}, GROUP_WORLD_SIZE={groups!r}: not integers") from None
    if not 0 <= g < n:
        raise NodeShapeError(f"GROUP_RANK={g} not in [0, GROUP_WORLD_SIZE={n})")
    rank, world = str(g * slots + local_rank), str(n * slots)
    return {"RANK": rank, "WORLD_SIZE": world, "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world}


@dataclass(frozen=True)
class SlotPlace:
    """What one worker process of a node gets: its variables and its cores."""

    local_rank: int
    local_world_size: int
    env: dict[str, str]
    cores: tuple[int, ...]


def slot_place(local_rank: int, slots: int, acc: Accelerator, node_env: Mapping[str, str],
               cores: Sequence[int], job_env: Mapping[str, str], all_devices: bool = False) -> SlotPlace:
    """The variables and cores of worker ``local_rank`` of ``slots`` on a node: ``node_env`` the
    agent's (its pilot's devices), ``cores`` its CPU set, ``job_env`` the job's (its
    ``OMP_NUM_THREADS`` or device variable wins; ``MALLETRAIN_DEVICES=all`` is ``all_devices``). One
    slot hides nothing and pins nothing. Where ``job_env`` has ``GROUP_RANK``/``GROUP_WORLD_SIZE``,
    each process also gets ``RANK``, ``WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE`` as torchrun."""
    if not 0 <= local_rank < slots:
        raise NodeShapeError(f"local rank {local_rank} not in [0, {slots})")
    if job_env.get(ENV_DEVICES, DEVICES_OWN) not in (DEVICES_OWN, DEVICES_ALL):
        raise NodeShapeError(f"{ENV_DEVICES}={job_env[ENV_DEVICES]!r}: must be {DEVICES_OWN!r} or {DEVICES_ALL!r}")
    all_devices = all_devices or job_env.get(ENV_DEVICES) == DEVICES_ALL
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(slots), **_world_ranks(local_rank, slots, job_env)}
    if slots == 1:
        return SlotPlace(local_rank, slots, env, tuple(sorted(cores)))
    share = core_share(cores, local_rank, slots)
    if "OMP_NUM_THREADS" not in job_env and share:
        env["OMP_NUM_THREADS"] = str(len(share))
    var = acc.variable
    if var is not None and not all_devices and var not in job_env:
        devices = visible_devices(acc, node_env, slots)
        env[var] = devices[local_rank % len(devices)]
    return SlotPlace(local_rank, slots, env, share)
