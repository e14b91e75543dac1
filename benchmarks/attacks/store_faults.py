"""The rendezvous store's attacks for ``bench_faults.py --parts round2`` (the store once
accepted any peer).

:func:`attacks` tries what an attacker tried against the unauthenticated TCPStore the daemon
hosted before: against the live daemon's store port (read from its state dir), a peer without the
job's secret; against a store server of the same class started here with two jobs, a job that
holds its own secret and goes for the other's keys, the daemon's keys, a checkpoint it did not
write, and unbounded growth. It returns (tried, accepted): an attack is accepted when the store
did what the attacker asked.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Callable

from contract.storekeys import ckpt_chunk_key, ckpt_key, gen_key, members_key, ready_key
from contract.wire import StoreClient, StoreError, send_frame
from contract.messages import new_secret
from malletrain.runtimes.store_server import StoreLimits
from malletrain.runtimes.torch_elastic import TorchRuntime
from malletrain.daemon.store import Store

Attack = Callable[[], bool]
"""One attack: True when the store did what the attacker asked."""


def _refused(fn: Callable[[], object]) -> bool:
    """False when ``fn`` was refused by the store (what must happen), True when it went through."""
    try:
        fn()
    except (StoreError, OSError):
        return False
    return True


def _daemon_store_port(state: Path) -> int | None:
    db = state / "store.db"
    if not db.exists():
        return None
    try:
        store = Store.open(db)
        try:
            return store.ports(["rendezvous"]).get("rendezvous") or None
        finally:
            store.close()
    except Exception:  # noqa: BLE001 - no store, no live attack; the in-process ones still run
        return None


def _live_attacks(port: int) -> dict[str, Attack]:
    addr = ("127.0.0.1", port)

    def wrong_secret() -> bool:
        return _refused(lambda: StoreClient(addr, "j000001", "w", new_secret(), timeout_s=5.0))

    def raw_frame() -> bool:
        """A TCPStore-style request without the handshake: anything but a closed connection is accepted."""
        with socket.create_connection(addr, timeout=5.0) as s:
            send_frame(s, b"\x00" * 64)
            try:
                return bool(s.recv(1))
            except OSError:
                return False

    return {"live: a peer without the job's secret": wrong_secret, "live: a frame without a handshake": raw_frame}


def _local_attacks(rt: TorchRuntime) -> dict[str, Attack]:
    addr = ("127.0.0.1", rt.port)

    def mallory() -> StoreClient:
        return StoreClient(addr, "mallory", "m0", rt.secret_for("mallory"), timeout_s=5.0)

    def victim_stranger() -> StoreClient:
        return StoreClient(addr, "victim", "not-a-worker", rt.secret_for("victim"), timeout_s=5.0)

    def grow() -> bool:
        worker = StoreClient(addr, "victim", "v0", rt.secret_for("victim"), timeout_s=5.0)
        blob = b"x" * (512 << 10)
        try:
            for i in range(64):  # 32 MiB asked; the quota here is 4 MiB
                worker.set(ckpt_chunk_key("victim", i), blob)
        except StoreError:
            return rt.store_usage("victim")[1] > 4 << 20
        return True

    return {
        "read another job's generation": lambda: _refused(lambda: mallory().get_or_none(gen_key("victim"))),
        "overwrite another job's checkpoint": lambda: _refused(lambda: mallory().set(ckpt_key("victim"), "chunks:0:0")),
        "end a job by publishing no members": lambda: _refused(
            lambda: StoreClient(addr, "victim", "v0", rt.secret_for("victim"), timeout_s=5.0).set(
                members_key("victim", 2), "[]")),
        "a checkpoint from a non-worker": lambda: _refused(
            lambda: victim_stranger().set(ckpt_chunk_key("victim", 0), b"evil")),
        "mark another job's worker ready": lambda: _refused(lambda: mallory().set(ready_key("victim", "v0"), "1")),
        "grow the store past the job's quota": grow,
    }


def attacks(state: Path) -> tuple[int, int]:
    """(tried, accepted) over the live daemon's store (if its port is known) and a local store server."""
    results: dict[str, bool] = {}
    port = _daemon_store_port(state)
    if port:
        for name, attack in _live_attacks(port).items():
            results[name] = attack()
    rt = TorchRuntime("127.0.0.1", 0, limits=StoreLimits(max_keys=256, max_bytes=4 << 20))
    rt.start()
    try:
        rt.launch_spec("victim", ["x"], "v0", "n1")
        rt.set_members("victim", ["v0"])
        rt.launch_spec("mallory", ["x"], "m0", "n2")
        for name, attack in _local_attacks(rt).items():
            results[name] = attack()
    finally:
        rt.close()
    for name, accepted in results.items():
        print(f"  store attack: {name}: {'ACCEPTED' if accepted else 'refused'}")
    return len(results), sum(results.values())


if __name__ == "__main__":  # alone: python benchmarks/attacks/store_faults.py [STATE_DIR of a live daemon]
    import sys
    import tempfile

    import faults_common  # noqa: F401  (puts benchmarks/ on sys.path, for the harness)
    from harness import last_line

    tried, accepted = attacks(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
    last_line(f"store attacks: {tried} tried, {accepted} accepted")
