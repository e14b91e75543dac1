"""A worker's committed training state: in-memory snapshots, their broadcast, their checkpoint bytes.

Both the broadcast and the stored checkpoint carry ``torch.save`` bytes read with
``torch.load(weights_only=True)``: bytes from the store or a rank cannot run code.
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


def _broadcast_bytes(data: bytes | None, src: int, rank: int, device: Any = None) -> bytes:
    """``data`` from ``src`` to every rank: its length (-1: the sender refused), then the bytes, in
    tensors on ``device`` (None: the CPU; a GPU under NCCL, which carries device tensors only)."""
    size = torch.tensor([len(data) if rank == src and data is not None else -1], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    n = int(size.item())
    if n < 0:
        if rank == src:
            return b""  # the caller raises its own reason
        raise CheckpointError(f"rank {src} holds a state that cannot be sent safely (see its log)")
    if rank == src:
        assert data is not None
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
        buf = buf.to(device) if device is not None else buf
    else:
        buf = torch.empty(n, dtype=torch.uint8, device=device)
    if n:
        dist.broadcast(buf, src=src)
    return data if rank == src and data is not None else buf.cpu().numpy().tobytes()


def broadcast_snapshot(snap: Snapshot | None, src: int, rank: int, job: str = "-", device: Any = None) -> Snapshot:
    """Send ``snap`` from ``src`` to every rank in the checkpoint format (no pickled objects); a state the
    format cannot carry is refused on every rank with :class:`CheckpointError`."""
    data: bytes | None = None
    refused: CheckpointError | None = None
    if rank == src:
        assert snap is not None
        try:
            data = encode_checkpoint(snap)
        except CheckpointError as exc:
            refused = exc
    received = _broadcast_bytes(data, src, rank) if device is None or str(device) == "cpu" \
        else _broadcast_bytes(data, src, rank, device)
    if refused is not None:
        raise refused
    if rank == src:
        assert snap is not None
        return snap
    return decode_checkpoint(received, job, f"the state broadcast by rank {src}")


def encode_checkpoint(snap: Snapshot) -> bytes:
    """The bytes of ``snap`` as stored in the daemon's store; what ``weights_only=True`` could not load is
    refused now."""
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


def decode_checkpoint(data: bytes, job: str, source: str = "stored checkpoint") -> Snapshot:
    """Load checkpoint bytes without unpickling arbitrary objects; :class:`CheckpointError` names the job
    and ``source`` (where the bytes came from)."""
    try:
        obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"job {job}: {source} refused by the safe loader: "
                              f"{str(exc).splitlines()[0][:200]}") from None
    if not isinstance(obj, dict) or set(obj) != set(_CKPT_FIELDS):
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"job {job}: {source} has fields {keys}, expected {list(_CKPT_FIELDS)}")
    version, model, optimizer, counters = (obj[k] for k in _CKPT_FIELDS)
    if not isinstance(version, int) or not isinstance(model, dict) or not isinstance(counters, dict):
        raise CheckpointError(f"job {job}: {source} has a malformed version, model or counters field")
    if optimizer is not None and not isinstance(optimizer, dict):
        raise CheckpointError(f"job {job}: {source}'s optimizer is a {type(optimizer).__name__}")
    return Snapshot(version, model, optimizer, counters)
