"""The rendezvous store against an attacker: no way in without the job's
secret, no key of another job, no write of the daemon's keys, no checkpoint from a stranger, no
unbounded growth. Each test fails against the unauthenticated TCPStore the daemon hosted before."""

from __future__ import annotations

import socket
from typing import Iterator

import pytest

from contract.storekeys import (
    BadKey,
    ckpt_chunk_key,
    ckpt_key,
    ckpt_seq_key,
    gen_key,
    members_key,
    parse_key,
    ready_key,
)
from contract.wire import (
    StoreClient,
    StoreConnectionLost,
    StoreImpostor,
    StoreRefused,
    recv_frame,
    send_frame,
)
from contract.messages import new_secret
from malletrain.runtimes.store_server import StoreLimits
from malletrain.runtimes.torch_elastic import TorchRuntime


@pytest.fixture
def runtime() -> Iterator[TorchRuntime]:
    rt = TorchRuntime("127.0.0.1", 0, limits=StoreLimits(max_keys=64, max_bytes=4 << 20))
    rt.start()
    rt.launch_spec("victim", ["x"], "v0", "n1")
    rt.set_members("victim", ["v0"])
    rt.launch_spec("mallory", ["x"], "m0", "n2")
    yield rt
    rt.close()


def client(rt: TorchRuntime, job: str, worker: str, secret: str | None = None) -> StoreClient:
    return StoreClient(("127.0.0.1", rt.port), job, worker, secret or rt.secret_for(job), timeout_s=5.0)


def test_a_peer_without_the_jobs_secret_is_refused_and_learns_nothing(runtime: TorchRuntime) -> None:
    with pytest.raises(StoreRefused, match="refused"):
        client(runtime, "victim", "v0", secret=new_secret())
    with pytest.raises(StoreRefused):  # another job's secret is no better
        client(runtime, "victim", "v0", secret=runtime.secret_for("mallory"))
    assert runtime.rejected.get("bad_proof") == 2
    assert runtime.members("victim") == ("v0",)


def test_a_raw_tcpstore_client_gets_nothing(runtime: TorchRuntime) -> None:
    """torch's own TCPStore client (what the attack used) cannot even connect, let alone read."""
    from datetime import timedelta

    import torch.distributed as dist

    with pytest.raises((RuntimeError, dist.DistError)):
        store = dist.TCPStore("127.0.0.1", runtime.port, is_master=False, timeout=timedelta(seconds=2))
        store.get(gen_key("victim"))
    assert sum(runtime.rejected.get(r, 0) for r in ("bad_hello", "too_big", "malformed")) >= 1
    assert runtime.members("victim") == ("v0",)


def test_a_job_cannot_read_or_write_another_jobs_keys(runtime: TorchRuntime) -> None:
    mallory = client(runtime, "mallory", "m0")
    for call in (lambda: mallory.get_or_none(gen_key("victim")),
                 lambda: mallory.check([members_key("victim", 1)]),
                 lambda: mallory.set(ckpt_key("victim"), "chunks:0:0"),
                 lambda: mallory.delete_key(gen_key("victim"))):
        with pytest.raises(StoreRefused, match="another job"):
            call()
    assert runtime.rejected["other_job"] == 4
    assert runtime.members("victim") == ("v0",)
    assert client(runtime, "victim", "v0").get(gen_key("victim")) == b"1"


def test_a_worker_cannot_end_or_split_its_job_through_the_daemons_keys(runtime: TorchRuntime) -> None:
    """The attack recorded a job COMPLETED by publishing an empty member list: only the daemon writes those."""
    worker = client(runtime, "victim", "v0")
    for key in (gen_key("victim"), members_key("victim", 2)):
        with pytest.raises(StoreRefused, match="only the daemon"):
            worker.set(key, "[]")
    with pytest.raises(StoreRefused, match="only the daemon"):
        worker.add(gen_key("victim"), 5)
    assert worker.get(gen_key("victim")) == b"1" and not worker.check([members_key("victim", 2)])


def test_a_checkpoint_from_anyone_but_the_jobs_own_workers_is_refused(runtime: TorchRuntime) -> None:
    stranger = client(runtime, "victim", "not-a-worker")  # holds the secret, but the daemon never started it
    for key, value in ((ckpt_chunk_key("victim", 0), b"evil"), (ckpt_key("victim"), b"chunks:1:4")):
        with pytest.raises(StoreRefused, match="not a worker of the job"):
            stranger.set(key, value)
    with pytest.raises(StoreRefused, match="not a worker of the job"):
        stranger.add(ckpt_seq_key("victim"), 1)
    assert runtime.checkpoint_generation("victim") is None
    own = client(runtime, "victim", "v0")
    own.set(ckpt_chunk_key("victim", 0), b"ok")  # the job's own rank may
    assert own.get(ckpt_chunk_key("victim", 0)) == b"ok"


def test_a_job_cannot_grow_the_store_past_its_quota(runtime: TorchRuntime) -> None:
    worker = client(runtime, "victim", "v0")
    blob = b"x" * (900 << 10)
    written = 0
    with pytest.raises(StoreRefused, match="limit"):
        for i in range(100):  # 90 MB asked; the quota is 4 MiB
            worker.set(ckpt_chunk_key("victim", i), blob)
            written += 1
    keys, used = runtime.store_usage("victim")
    assert written == 4 and used <= 4 << 20
    with pytest.raises(StoreRefused, match="keys"):
        for i in range(200):
            worker.set(ready_key("victim", f"w{i}"), "1")
    assert runtime.store_usage("victim")[0] == 64
    assert runtime.rejected["quota"] == 2
    assert worker.get(gen_key("victim")) == b"1"  # refused writes leave the connection usable


def test_keys_outside_the_schema_are_refused_and_named() -> None:
    for bad in ("mt/j", "mt/j/nope", "x/j/gen", "mt/j/members/x", "mt/j/gen/3", "mt/j/ready", "m" * 700):
        with pytest.raises(BadKey, match="store key"):
            parse_key(bad)
    assert parse_key("mt/j/ckpt/3").arg == "3" and parse_key("mt/j/ready/w.1").arg == "w.1"


def test_an_unknown_job_is_refused(runtime: TorchRuntime) -> None:
    with pytest.raises(StoreRefused):
        client(runtime, "nobody", "w")


def test_a_worker_believes_no_server_that_cannot_prove_the_key(runtime: TorchRuntime) -> None:
    """A local user who binds the store's port while the daemon is down cannot feed workers a generation."""
    import threading

    with socket.socket() as fake:
        fake.bind(("127.0.0.1", 0))
        fake.listen()
        port = fake.getsockname()[1]

        def serve() -> None:
            conn, _ = fake.accept()
            with conn:
                recv_frame(conn)
                send_frame(conn, b"N" + b"\0" * 32)
                recv_frame(conn)
                send_frame(conn, b"P" + b"\1" * 32)  # a proof it cannot make

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        with pytest.raises(StoreImpostor, match="cannot prove"):
            StoreClient(("127.0.0.1", port), "victim", "v0", runtime.secret_for("victim"), timeout_s=5.0)
        t.join(5)


def test_a_closed_store_is_a_lost_connection_not_a_hang(runtime: TorchRuntime) -> None:
    worker = client(runtime, "victim", "v0")
    runtime.close()
    with pytest.raises(StoreConnectionLost):
        worker.get(gen_key("victim"))


def test_the_daemon_serves_the_store_without_importing_torch() -> None:
    """A restarted daemon must answer its agents and workers within seconds: no torch import on its path."""
    import subprocess
    import sys

    code = ("import sys; from malletrain.runtimes.torch_elastic import TorchRuntime; rt = TorchRuntime(); "
            "rt.start(); rt.close(); assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
