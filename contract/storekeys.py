"""The rendezvous store's key schema: every key of a job, who may write it, and how values parse.

Every key of a job lives under ``mt/<job>/``:

``mt/<job>/gen``                  the current generation number (decimal text)            daemon
``mt/<job>/members/<g>``          JSON list of the worker ids of generation ``g``, in rank order  daemon
``mt/<job>/handover/<g>``         set when generation ``g`` keeps no worker of the last non-empty  daemon
                                  generation: its workers start from the checkpoint of ``active``
``mt/<job>/ready/<worker>``       set by a worker once it is connected and waits to join    workers
``mt/<job>/arrive/<g>``           counter of workers that reached generation ``g``'s barrier  workers
``mt/<job>/joined/<g>``           set by the last worker to arrive: the barrier is complete  workers
``mt/<job>/pg/<g>``               where generation ``g``'s rank 0 serves gloo's own rendezvous  workers
                                  (``host port token``, see :mod:`malletrain.worker.elastic.state`)
``mt/<job>/active``               the last generation whose world formed (set by its rank 0)  workers
``mt/<job>/ckpt``, ``ckpt_tag``   the last checkpoint (written by rank 0 when its world hands over  workers
                                  to new workers or on SIGTERM) and the generation it was taken in;
                                  ``ckpt`` holds ``chunks:N:SIZE``, the bytes are in ``ckpt/0..N-1``
``mt/<job>/ckpt_seq``             odd while a worker writes the checkpoint, even once done (the  workers
                                  daemon copies each new one to ``STATE_DIR/checkpoints/<job>.ckpt``)
``mt/<job>/resume/<worker>``      the generation a worker was in when it reconnected to a new  workers
                                  store (after a daemon restart): numbering goes on above it
``mt/<job>/world/<g>``            a restarted (``torchrun``) job's world ``g``: each worker's  daemon
                                  rank place and the world's restart count (JSON)
``mt/<job>/done/<g>``             counter of a restarted job's ranks of world ``g`` whose      workers
                                  command exited 0

The store (:mod:`malletrain.runtimes.store_server`) serves each connection only the keys of
the job it authenticated for, refuses a worker's write to a key the daemon owns, and refuses
any key not in this table (:func:`parse_key`). Pure: no torch, no I/O.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

PREFIX = "mt"


class KeyKind(str, enum.Enum):
    """What a key holds (its second path word)."""

    GEN = "gen"
    MEMBERS = "members"
    HANDOVER = "handover"
    READY = "ready"
    ARRIVE = "arrive"
    JOINED = "joined"
    PG = "pg"
    ACTIVE = "active"
    CKPT = "ckpt"
    CKPT_TAG = "ckpt_tag"
    CKPT_SEQ = "ckpt_seq"
    RESUME = "resume"
    WORLD = "world"
    DONE = "done"
    FAILED = "failed"


DAEMON_KINDS = frozenset({KeyKind.GEN, KeyKind.MEMBERS, KeyKind.HANDOVER, KeyKind.WORLD})
"""Keys only the daemon writes: a worker that tries is refused (it would end or split its job)."""

CHECKPOINT_KINDS = frozenset({KeyKind.CKPT, KeyKind.CKPT_TAG, KeyKind.CKPT_SEQ})
"""Keys of the job's checkpoint: written only by a worker the daemon started for the job."""

_NO_ARG = frozenset({KeyKind.GEN, KeyKind.ACTIVE, KeyKind.CKPT_TAG, KeyKind.CKPT_SEQ})
_GEN_ARG = frozenset({KeyKind.MEMBERS, KeyKind.HANDOVER, KeyKind.ARRIVE, KeyKind.JOINED, KeyKind.PG,
                      KeyKind.WORLD, KeyKind.DONE, KeyKind.FAILED})
_WORKER_ARG = frozenset({KeyKind.READY, KeyKind.RESUME})

MAX_KEY = 600
"""Longest key (characters): two ids of at most 256 and the words around them."""


class BadKey(ValueError):
    """A key that is not in the schema (the message names it)."""


@dataclass(frozen=True)
class Key:
    """A parsed key: its job, its kind and its argument ("" for none)."""

    job: str
    kind: KeyKind
    arg: str = ""


def parse_key(key: str) -> Key:
    """The parts of ``key``; :class:`BadKey` naming it if it is not one of the schema's."""
    if len(key) > MAX_KEY:
        raise BadKey(f"store key of {len(key)} characters (limit {MAX_KEY})")
    words = key.split("/")
    if len(words) not in (3, 4) or words[0] != PREFIX or not words[1]:
        raise BadKey(f"store key {key[:80]!r} is not mt/<job>/<kind>[/<arg>]")
    try:
        kind = KeyKind(words[2])
    except ValueError:
        raise BadKey(f"store key {key[:80]!r}: unknown kind {words[2][:40]!r}") from None
    arg = words[3] if len(words) == 4 else ""
    ok = (
        (kind in _NO_ARG and len(words) == 3)
        or (kind in _GEN_ARG and arg.isdigit() and arg.isascii())
        or (kind in _WORKER_ARG and bool(arg))
        or (kind is KeyKind.CKPT and (len(words) == 3 or (arg.isdigit() and arg.isascii())))
    )
    if not ok:
        raise BadKey(f"store key {key[:80]!r}: {kind.value} takes "
                        f"{'no argument' if kind in _NO_ARG else 'a generation' if kind in _GEN_ARG else 'a worker id'}")
    return Key(words[1], kind, arg)


def gen_key(job: str) -> str:
    return f"{PREFIX}/{job}/gen"


def members_key(job: str, gen: int) -> str:
    return f"{PREFIX}/{job}/members/{gen}"


def ready_key(job: str, worker: str) -> str:
    return f"{PREFIX}/{job}/ready/{worker}"


def arrive_key(job: str, gen: int) -> str:
    return f"{PREFIX}/{job}/arrive/{gen}"


def joined_key(job: str, gen: int) -> str:
    return f"{PREFIX}/{job}/joined/{gen}"


def pg_key(job: str, gen: int) -> str:
    """Where generation ``gen``'s rank 0 serves the store of gloo's own rendezvous."""
    return f"{PREFIX}/{job}/pg/{gen}"


def world_key(job: str, gen: int) -> str:
    """A restarted (``torchrun``) job's world ``gen``: rank places and restart count (the daemon writes it)."""
    return f"{PREFIX}/{job}/world/{gen}"


def done_key(job: str, gen: int) -> str:
    """Counter of world ``gen``'s ranks whose command exited 0 (a restarted job's workers add to it; the
    daemon ends the job COMPLETED once it reaches the world's ranks)."""
    return f"{PREFIX}/{job}/done/{gen}"


def failed_key(job: str, gen: int) -> str:
    """Counter of world ``gen``'s ranks whose command failed (a ``torchrun`` job's rank agents add to it):
    once every rank has, no newer world can help and the failure counts at once."""
    return f"{PREFIX}/{job}/failed/{gen}"


def handover_key(job: str, gen: int) -> str:
    return f"{PREFIX}/{job}/handover/{gen}"


def active_key(job: str) -> str:
    return f"{PREFIX}/{job}/active"


def ckpt_key(job: str) -> str:
    return f"{PREFIX}/{job}/ckpt"


def ckpt_tag_key(job: str) -> str:
    return f"{PREFIX}/{job}/ckpt_tag"


def ckpt_seq_key(job: str) -> str:
    """A counter bracketing each checkpoint write: odd while a worker writes, even once it is done."""
    return f"{PREFIX}/{job}/ckpt_seq"


def resume_key(job: str, worker: str) -> str:
    return f"{PREFIX}/{job}/resume/{worker}"


#: A checkpoint travels through the store in chunks that fit one frame of the store's channel.
CKPT_CHUNK_BYTES = 960 << 10


def ckpt_chunk_key(job: str, index: int) -> str:
    return f"{PREFIX}/{job}/ckpt/{index}"


def ckpt_header(n_chunks: int, size: int) -> str:
    """The value of :func:`ckpt_key`: how many chunks hold the checkpoint, and its size."""
    return f"chunks:{n_chunks}:{size}"


MAX_CKPT_BYTES = 1 << 30
"""The largest checkpoint a header may announce (a job's whole share of the store)."""


def parse_ckpt_header(raw: bytes, job: str) -> tuple[int, int]:
    """``(chunks, size)`` of a checkpoint header a worker wrote: SIZE at most :data:`MAX_CKPT_BYTES` and
    exactly the chunks of :data:`CKPT_CHUNK_BYTES` it takes (``chunks:5000000:0`` made the daemon build
    a 5M-key list every loop); :class:`ValueError` naming the job otherwise."""
    try:
        tag, n_text, size_text = raw.decode("ascii").split(":")
        if tag != "chunks" or not (n_text.isdigit() and size_text.isdigit()) or len(n_text) + len(size_text) > 24:
            raise ValueError
        n, size = int(n_text), int(size_text)
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"job {job}: checkpoint header {raw[:40]!r} is not 'chunks:N:SIZE'") from None
    if size > MAX_CKPT_BYTES or n != -(-size // CKPT_CHUNK_BYTES):
        raise ValueError(f"job {job}: checkpoint header {raw[:40]!r}: {n} chunks for {size} bytes "
                         f"(a checkpoint of at most {MAX_CKPT_BYTES} bytes in chunks of {CKPT_CHUNK_BYTES})")
    return n, size


def parse_members(raw: bytes, job: str, gen: int) -> tuple[str, ...]:
    """Decode the member list stored for ``job`` generation ``gen``."""
    try:
        members = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"job {job} generation {gen}: member list is not JSON: {exc}") from None
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ValueError(f"job {job} generation {gen}: member list {members!r} is not a list of strings")
    return tuple(members)
