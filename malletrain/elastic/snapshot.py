"""A worker's committed training state: in-memory snapshots, their broadcast, their checkpoint bytes.

A :class:`Snapshot` is what :meth:`State.commit` keeps: deep copies of the
model's and optimizer's state dicts plus the counters. Joining a world sends
the newest one from one rank to all (:func:`broadcast_snapshot`: a small
pickled skeleton, then every tensor in one byte buffer). A whole-world
handover stores one in the daemon's store as checkpoint bytes
(:func:`encode_checkpoint` / :func:`decode_checkpoint`); those are read with
``torch.load(weights_only=True)``, so a value planted in the store cannot run
code when a worker loads it.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

_CKPT_FIELDS = ("version", "model", "optimizer", "counters")


class CheckpointError(ValueError):
    """Checkpoint bytes that are not a checkpoint of this layer (or not loadable safely)."""


@dataclass
class Snapshot:
    version: int
    model: dict[str, Any]
    optimizer: dict[str, Any] | None
    counters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _TensorRef:
    """Where a tensor of a snapshot sits in the broadcast byte buffer."""

    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _extract(obj: Any, tensors: list[torch.Tensor], offset: list[int]) -> Any:
    """``obj`` with every CPU tensor replaced by a :class:`_TensorRef`; the tensors go to ``tensors``."""
    if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided:
        flat = obj.detach().contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
        ref = _TensorRef(offset[0], raw.numel(), tuple(obj.shape), obj.dtype)
        tensors.append(raw)
        offset[0] += raw.numel()
        return ref
    if isinstance(obj, dict):
        return {k: _extract(v, tensors, offset) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_extract(v, tensors, offset) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_extract(v, tensors, offset) for v in obj)
    return obj


def _inject(obj: Any, buf: torch.Tensor) -> Any:
    if isinstance(obj, _TensorRef):
        raw = buf[obj.offset : obj.offset + obj.nbytes].clone()  # own, aligned storage
        return (raw.view(obj.dtype) if obj.dtype != torch.uint8 else raw).reshape(obj.shape)
    if isinstance(obj, dict):
        return {k: _inject(v, buf) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_inject(v, buf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_inject(v, buf) for v in obj)
    return obj


def broadcast_snapshot(snap: Snapshot | None, src: int, rank: int) -> Snapshot:
    """Send ``snap`` from ``src`` to every rank: its structure pickled, its tensors as one byte buffer."""
    tensors: list[torch.Tensor] = []
    box: list[Any] = [None]
    if rank == src:
        assert snap is not None
        size = [0]
        skeleton = _extract((snap.model, snap.optimizer), tensors, size)
        box = [(snap.version, snap.counters, skeleton, size[0])]
    dist.broadcast_object_list(box, src=src)
    version, counters, skeleton, nbytes = box[0]
    buf = torch.cat(tensors) if rank == src and tensors else torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        dist.broadcast(buf, src=src)
    if rank == src:
        assert snap is not None
        return snap
    model, optimizer = _inject(skeleton, buf)
    return Snapshot(version, model, optimizer, counters)


def encode_checkpoint(snap: Snapshot) -> bytes:
    """The bytes of ``snap`` as stored in the daemon's store (tensors and plain data only).

    ``State.extra`` must hold plain data (numbers, strings, lists, dicts, tensors):
    anything else could not be loaded with ``weights_only=True`` and is refused here.
    """
    obj = {"version": snap.version, "model": snap.model, "optimizer": snap.optimizer, "counters": snap.counters}
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    try:  # refuse now what a new worker could not load later
        decode_checkpoint(data, "(being saved)")
    except CheckpointError as exc:
        raise CheckpointError(f"the state cannot be checkpointed safely: {exc}. Keep State.extra to "
                              "numbers, strings, lists, dicts and tensors") from None
    return data


def decode_checkpoint(data: bytes, job: str) -> Snapshot:
    """Load checkpoint bytes without unpickling arbitrary objects; :class:`CheckpointError` names the job."""
    try:
        obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"job {job}: stored checkpoint refused by the safe loader: "
                              f"{str(exc).splitlines()[0][:200]}") from None
    if not isinstance(obj, dict) or set(obj) != set(_CKPT_FIELDS):
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"job {job}: stored checkpoint has fields {keys}, expected {list(_CKPT_FIELDS)}")
    version, model, optimizer, counters = (obj[k] for k in _CKPT_FIELDS)
    if not isinstance(version, int) or not isinstance(model, dict) or not isinstance(counters, dict):
        raise CheckpointError(f"job {job}: stored checkpoint has a malformed version, model or counters field")
    if optimizer is not None and not isinstance(optimizer, dict):
        raise CheckpointError(f"job {job}: stored checkpoint's optimizer is a {type(optimizer).__name__}")
    return Snapshot(version, model, optimizer, counters)
