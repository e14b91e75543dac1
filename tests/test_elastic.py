"""The torch runtime in one process: store keys, generations, rendezvous, State, run."""

from __future__ import annotations

import json
import threading
import time
import weakref
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist

from malletrain.worker.elastic import (
    LeaveJob,
    Rendezvous,
    Rescaled,
    State,
    is_comm_failure,
    run,
)
from contract.exits import EXIT_STORE_LOST
from contract.wire import StoreClient
from contract.workerenv import ENV_JOB_SECRET
from malletrain.runtimes import LaunchSpec, Runtime
from contract.workerenv import ENV_JOB, ENV_MONITOR, ENV_STORE, ENV_STORE_GRACE, ENV_WORKER, parse_address
from malletrain.runtimes.torch_elastic import RuntimeStateError, TorchRuntime
from contract.storekeys import arrive_key, gen_key, handover_key, joined_key, members_key, resume_key
from stepping import wait_until


@pytest.fixture
def runtime() -> Iterator[TorchRuntime]:
    rt = TorchRuntime("127.0.0.1", 0, monitor="tcp://127.0.0.1:5999")
    rt.start()
    yield rt
    rt.close()


def client_store(rt: TorchRuntime, job: str = "j", worker: str = "watch") -> StoreClient:
    """An authenticated client of ``job``'s keys, as worker ``worker`` (which the runtime then knows)."""
    rt.launch_spec(job, ["x"], worker, "n")
    return StoreClient(("127.0.0.1", rt.port), job, worker, rt.secret_for(job))


def make_rdzv(rt: TorchRuntime, job: str, worker: str, **kwargs: Any) -> Rendezvous:
    rdzv = Rendezvous(client_store(rt, job, worker), job, worker, **kwargs)
    rdzv.secret = rt.secret_for(job)
    return rdzv


def make_state(rt: TorchRuntime, job: str, worker: str, **counters: int) -> State:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return State(model, opt, rendezvous=make_rdzv(rt, job, worker), timeout_s=2.0, **counters)


@pytest.fixture(autouse=True)
def no_process_group() -> Iterator[None]:
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


# -- TorchRuntime ---------------------------------------------------------------------------

def test_runtime_satisfies_protocol(runtime: TorchRuntime) -> None:
    rt: Runtime = runtime
    assert rt.name == "torch"
    for method in ("start", "close", "launch_spec", "set_members", "forget"):
        assert callable(getattr(rt, method)), method
    assert runtime.port > 0


def test_launch_spec_env(runtime: TorchRuntime) -> None:
    spec = runtime.launch_spec("job1", ["python", "train.py"], "w0", "node7")
    assert isinstance(spec, LaunchSpec)
    assert spec.argv == ("python", "train.py")
    assert spec.env[ENV_JOB] == "job1" and spec.env[ENV_WORKER] == "w0"
    assert spec.env[ENV_MONITOR] == "tcp://127.0.0.1:5999"
    assert parse_address(spec.env[ENV_STORE]) == ("127.0.0.1", runtime.port)


@pytest.mark.parametrize("job,worker,command", [("", "w", ["x"]), ("a/b", "w", ["x"]), ("j", "w 1", ["x"]), ("j", "w", [])])
def test_launch_spec_rejects_bad_input(runtime: TorchRuntime, job: str, worker: str, command: list[str]) -> None:
    with pytest.raises(ValueError, match="id|command"):
        runtime.launch_spec(job, command, worker, "n")


def test_launch_spec_before_start_names_the_problem() -> None:
    with pytest.raises(RuntimeStateError, match="start"):
        TorchRuntime().launch_spec("j", ["x"], "w", "n")


def test_set_members_bumps_generation_and_publishes(runtime: TorchRuntime) -> None:
    store = client_store(runtime)
    assert runtime.set_members("j", ["a", "b"]) == 1
    assert runtime.set_members("j", ["b"]) == 2
    assert runtime.set_members("other", ["x"]) == 1
    assert store.get(gen_key("j")) == b"2"
    assert json.loads(store.get(members_key("j", 1))) == ["a", "b"]
    rdzv = Rendezvous(store, "j", "b")
    assert rdzv.generation() == 2 and rdzv.members(2) == ("b",)
    assert runtime.members("j") == ("b",) and runtime.members("j", 1) == ("a", "b")
    assert runtime.generation("j") == 2


def test_members_of_a_forgotten_generation_is_none(runtime: TorchRuntime) -> None:
    runtime.set_members("j", ["a"])
    rdzv = make_rdzv(runtime, "j", "a")
    assert rdzv.members(1) == ("a",)
    runtime.forget("j")
    assert rdzv.members(1) is None


def test_set_members_rejects_duplicates(runtime: TorchRuntime) -> None:
    with pytest.raises(ValueError, match="duplicate.*'a'"):
        runtime.set_members("j", ["a", "b", "a"])
    assert runtime.generation("j") == 0


def test_forget_deletes_keys_and_numbering_goes_on(runtime: TorchRuntime) -> None:
    runtime.launch_spec("j", ["x"], "a", "n")
    runtime.set_members("j", ["a"])
    Rendezvous(client_store(runtime), "j", "a").mark_ready()
    runtime.forget("j")
    runtime.forget("j")
    store = client_store(runtime)
    assert not store.check([members_key("j", 1)]) and not runtime.ready("j", "a")
    assert Rendezvous(store, "j", "a").members(1) is None
    assert runtime.members("j") == ()
    # a resumed job never reuses a generation (its gloo keys may still be in the store)
    assert runtime.set_members("j", ["a"]) == 2
    assert store.get(gen_key("j")) == b"2"


def test_close_is_idempotent() -> None:
    rt = TorchRuntime()
    rt.close()
    rt.start()
    rt.start()
    rt.close()
    rt.close()


# -- Rendezvous -----------------------------------------------------------------------------

def test_barrier_waits_for_all_members(runtime: TorchRuntime) -> None:
    runtime.set_members("j", ["a", "b"])
    a = Rendezvous(client_store(runtime), "j", "a")
    b = Rendezvous(client_store(runtime), "j", "b")
    watch = client_store(runtime)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(a.barrier(1, 2)))
    t.start()
    wait_until(lambda: watch.add(arrive_key("j", 1), 0) == 1, "a has arrived")  # a has arrived ...
    assert result == [] and not watch.check([joined_key("j", 1)])  # ... and is held until b comes
    assert b.barrier(1, 2) is True
    t.join(30)
    assert result == [True]


def test_barrier_gives_up_for_a_newer_generation(runtime: TorchRuntime) -> None:
    runtime.set_members("j", ["a", "b"])
    a = Rendezvous(client_store(runtime), "j", "a")
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(a.barrier(1, 2)))
    t.start()
    runtime.set_members("j", ["a"])
    t.join(5)
    assert result == [False]


def test_ready_marks(runtime: TorchRuntime) -> None:
    a = Rendezvous(client_store(runtime), "j", "a")
    assert not a.all_ready(("a",)) and a.all_ready(())
    a.mark_ready()
    assert a.all_ready(("a",)) and runtime.ready("j", "a")
    assert not a.all_ready(("a", "b"))
    a.clear_ready()
    assert not runtime.ready("j", "a")


# -- failure classification -------------------------------------------------------------------

@pytest.mark.parametrize(
    "exc,expected",
    [
        (RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4"), True),
        (RuntimeError("Connection reset by peer"), True),
        (dist.DistBackendError("nccl went away"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("connection closed"), False),
        (Rescaled("x"), False),
        (LeaveJob("x"), False),
    ],
)
def test_is_comm_failure(exc: BaseException, expected: bool) -> None:
    assert is_comm_failure(exc) is expected


def test_wrapped_comm_failure_is_recognised() -> None:
    try:
        try:
            raise RuntimeError("Connection closed by peer")
        except RuntimeError as inner:
            raise ValueError("while reducing") from inner
    except ValueError as outer:
        assert is_comm_failure(outer)


def _receive_as_rank_1(monkeypatch: pytest.MonkeyPatch, sent: bytes):
    """What rank 1 of a world makes of ``sent`` when rank 0 broadcasts its state."""
    from malletrain.worker.elastic import broadcast_snapshot, snapshot

    monkeypatch.setattr(snapshot, "_broadcast_bytes", lambda data, src, rank: sent)
    return broadcast_snapshot(None, 0, 1, "j")


def test_broadcast_state_keeps_every_tensor_and_plain_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from malletrain.worker.elastic import Snapshot, encode_checkpoint

    model = {
        "w": torch.randn(3, 5),
        "d": torch.randn(2, dtype=torch.float64),
        "flags": torch.tensor([True, False, True]),
        "nested": [{"m": torch.arange(6.0).reshape(2, 3).t()}, 3, "x"],  # non-contiguous
    }
    opt = {"state": {0: {"momentum_buffer": torch.ones(2), "step": torch.tensor(7.0)}},
           "param_groups": [{"lr": 0.1, "params": [0], "nesterov": False, "foreach": None}]}
    snap = Snapshot(5, model, opt, {"step": 9, "epoch": 1, "samples": 36, "extra": {"tag": "x", "t": torch.ones(1)}})
    back = _receive_as_rank_1(monkeypatch, encode_checkpoint(snap))
    assert back.version == 5 and back.counters["step"] == 9 and back.counters["extra"]["tag"] == "x"
    for key in ("w", "d", "flags"):
        assert back.model[key].dtype == model[key].dtype and torch.equal(back.model[key], model[key])
    assert torch.equal(back.model["nested"][0]["m"], model["nested"][0]["m"]) and back.model["nested"][1:] == [3, "x"]
    assert back.optimizer["param_groups"] == opt["param_groups"]
    assert torch.equal(back.optimizer["state"][0]["momentum_buffer"], torch.ones(2))  # int keys survive


@pytest.mark.parametrize("form", ["torch.save", "bare pickle"])
def test_a_broadcast_state_that_would_run_code_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                          form: str) -> None:
    """Finding 4: bytes another rank (or anything on its connection) sends are never unpickled."""
    from malletrain.worker.elastic import CheckpointError

    marker = tmp_path / "pwned"
    data = _planted_state(marker, form)
    with pytest.raises(CheckpointError, match="job j: the state broadcast by rank 0 refused by the safe loader"):
        _receive_as_rank_1(monkeypatch, data)
    assert not marker.exists()


def test_a_state_the_safe_format_cannot_carry_is_refused_by_the_sender() -> None:
    from malletrain.worker.elastic import CheckpointError, Snapshot, broadcast_snapshot

    odd = Snapshot(1, {}, None, {"step": 1, "epoch": 0, "samples": 1, "extra": {"obj": object()}})
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with pytest.raises(CheckpointError, match="State.extra"):
        broadcast_snapshot(odd, 0, 0, "j")


# -- State without a runtime (one local worker) -------------------------------------------------

def _train_steps(state: State, n: int) -> None:
    assert state.optimizer is not None
    for _ in range(n):
        state.optimizer.zero_grad()
        state.model(torch.ones(3, 4)).sum().backward()
        state.optimizer.step()
        state.step += 1
        state.samples += 3


def test_restore_rolls_back_model_optimizer_and_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_STORE, raising=False)
    model = torch.nn.Linear(4, 2)
    state = State(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), epoch=1, note="x")
    _train_steps(state, 2)
    state.commit()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    after_one = None
    for _ in range(2):  # restoring twice gives the same trajectory: the snapshot is not aliased
        _train_steps(state, 1)
        now = {k: v.clone() for k, v in model.state_dict().items()}
        if after_one is not None:
            assert all(torch.equal(now[k], after_one[k]) for k in now)
        after_one = now
        state.extra["note"] = "changed"
        state.restore()
        assert state.step == 2 and state.samples == 6 and state.epoch == 1 and state.extra == {"note": "x"}
        assert all(torch.equal(model.state_dict()[k], saved[k]) for k in saved)


def test_run_standalone_returns_and_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_STORE, raising=False)
    model = torch.nn.Linear(4, 2)
    state = State(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert not state.elastic

    def train(s: State) -> int:
        ddp = s.ddp()
        ddp(torch.ones(2, 4)).sum().backward()
        s.step += 1
        s.commit()
        return s.step

    assert run(train, state) == 1
    assert state.world_size == 1 and state.rank == 0

    def broken(s: State) -> None:
        raise RuntimeError("Connection closed by peer")  # no runtime: nothing to recover with

    with pytest.raises(RuntimeError, match="Connection closed"):
        run(broken, state)


_NO_GROUP_LEFT = """
import sys, weakref
import torch, torch.distributed as dist
from malletrain.worker.elastic import State, run
groups = []

def train(s):
    groups.append(weakref.ref(dist.group.WORLD))
    s.ddp()(torch.ones(2, 4)).sum().backward()
    s.step += 1
    s.commit()
    if len(groups) == 2:
        raise ValueError("a bug in the training script")
    return s.step

state = State(torch.nn.Linear(4, 2))  # no optimizer: making one imports torch.distributed.nn early
assert run(train, state) == 1
try:
    run(train, state)
except ValueError:
    pass
alive = [i for i, ref in enumerate(groups) if ref() is not None]
assert len(groups) == 2 and not alive and not dist.is_initialized(), (len(groups), alive)
print("ok")
"""


def test_run_leaves_no_gloo_group_behind() -> None:
    """However run() ends, the groups it made are freed (their gloo threads joined) before it returns.

    In a fresh interpreter, as a worker: the first DDP model imports torch.distributed.nn.functional,
    which binds ``group.WORLD`` as a default argument; imported while a group existed, it kept that
    group and its gloo threads alive until the interpreter's exit, which they raced (SIGABRT,
    "terminate called without an active exception", after a finished job).
    """
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLETRAIN_")}
    done = subprocess.run([sys.executable, "-c", _NO_GROUP_LEFT], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_run_keeps_a_group_the_script_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_STORE, raising=False)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = torch.nn.Linear(4, 2)
    assert run(lambda s: s.world_size, State(model)) == 1
    assert dist.is_initialized()  # not run()'s to destroy


# -- State with the runtime, one worker in this process -------------------------------------------

def test_renumber_recover_and_leave_in_process(runtime: TorchRuntime) -> None:
    runtime.set_members("j", ["a"])
    state = make_state(runtime, "j", "a")
    calls: list[int] = []
    weights_at_commit: dict[int, torch.Tensor] = {}
    lost: dict[int, torch.Tensor] = {}
    failed: list[int] = []

    groups: list[Any] = []

    def train(s: State) -> None:
        calls.append(s.step)
        groups.append(weakref.ref(dist.group.WORLD))
        while True:
            _train_steps(s, 1)
            if s.step == 5 and not failed:
                failed.append(s.step)
                lost[5] = s.model.weight.detach().clone()
                runtime.set_members("j", ["a"])  # the job manager's new generation after the "recall"
                raise RuntimeError("[gloo] Connection closed by peer")
            weights_at_commit[s.step] = s.model.weight.detach().clone()
            s.commit()
            if s.step == 3 and len(calls) == 1:
                runtime.set_members("j", ["a"])  # the same world again: renumbered at the next commit
            if s.step == 7:
                runtime.set_members("j", [])

    with pytest.raises(SystemExit) as exit_info:
        run(train, state)
    assert exit_info.value.code == 0
    # call 1 from step 0; renumbered at the commit of step 4 (the function goes on); recovery back to
    # step 4; leave at step 8
    assert calls == [0, 4]
    assert [e.kind for e in state.rescales] == ["join", "change", "recover", "leave"]
    assert [e.to_generation for e in state.rescales[:3]] == [1, 2, 3]
    # the retried step 5 starts from the commit of step 4 (weights and momentum): same result
    assert torch.equal(weights_at_commit[5], lost[5])
    assert not torch.equal(weights_at_commit[5], weights_at_commit[4])
    assert not dist.is_initialized()
    assert len(groups) == 2 and all(ref() is None for ref in groups)  # every world's group is freed
    assert not runtime.ready("j", "a")


def test_a_failed_world_is_freed_before_the_recovery_waits(runtime: TorchRuntime,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed world's gloo group (held by the training function's DDP model, in the failure's
    traceback) is freed before the worker waits for the next generation: its connections close, so a
    peer blocked on this worker fails at once instead of at its collective timeout."""
    runtime.set_members("j", ["a"])
    state = make_state(runtime, "j", "a")
    groups: list[Any] = []
    alive_at_rejoin: list[bool] = []
    rejoin = state._join

    def join_again(gen: int) -> None:
        alive_at_rejoin.append(groups[0]() is not None)
        rejoin(gen)

    def train(s: State) -> None:
        net = s.ddp()  # the training function's own reference to the world's group
        groups.append(weakref.ref(dist.group.WORLD))
        if len(groups) == 1:
            net(torch.zeros(1, 4)).sum().backward()
            s.commit()
            monkeypatch.setattr(s, "_join", join_again)
            runtime.set_members("j", ["a"])
            raise RuntimeError("[gloo] Connection closed by peer")
        runtime.set_members("j", [])
        s.commit()

    with pytest.raises(SystemExit):
        run(train, state)
    assert [e.kind for e in state.rescales] == ["join", "recover", "leave"]
    assert alive_at_rejoin[0] is False


def test_user_errors_are_not_recovered(runtime: TorchRuntime) -> None:
    runtime.set_members("j", ["a"])
    state = make_state(runtime, "j", "a")

    def train(s: State) -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        run(train, state)


def test_worker_started_ahead_waits_through_a_suspension(runtime: TorchRuntime) -> None:
    runtime.set_members("j", ["old"])
    runtime.set_members("j", [])  # suspended ...
    runtime.forget("j")  # ... and forgotten, as the daemon does
    state = make_state(runtime, "j", "late")
    published: list[int] = []

    def publish_once_ready() -> None:  # the job manager: publish once the worker started ahead is ready
        wait_until(lambda: runtime.ready("j", "late"), "the late worker is ready")
        published.append(runtime.set_members("j", ["late"]))

    publisher = threading.Thread(target=publish_once_ready, daemon=True)
    publisher.start()

    def train(s: State) -> None:
        while True:
            s.step += 1
            s.commit()
            if s.step == 1:
                runtime.set_members("j", [])  # the empty generation 4: leave at the next commit

    with pytest.raises(SystemExit):
        run(train, state)
    publisher.join(30)
    assert published == [3]
    assert [(e.kind, e.to_generation) for e in state.rescales] == [("join", 3), ("leave", 3)]
    assert state.step == 2


def test_handover_marker_only_when_nobody_stays(runtime: TorchRuntime) -> None:
    store = client_store(runtime)
    runtime.set_members("j", ["a", "b"])  # 1
    runtime.set_members("j", ["b", "c"])  # 2: b stays
    runtime.set_members("j", [])  # 3: suspended
    runtime.forget("j")
    runtime.set_members("j", ["d"])  # 4: nobody of generation 2 stays
    assert [store.check([handover_key("j", g)]) for g in (1, 2, 3)] == [False, False, False]
    assert store.get(handover_key("j", 4)) == b"2"


def test_whole_world_hands_over_through_the_store(runtime: TorchRuntime) -> None:
    """Worker a is replaced by b (nobody stays): b starts from a's last commit, not from scratch."""
    runtime.set_members("j", ["a"])
    a = make_state(runtime, "j", "a")

    def train_a(s: State) -> None:
        while True:
            _train_steps(s, 1)
            s.commit()
            if s.step == 3:
                make_rdzv(runtime, "j", "b").mark_ready()  # b was started ahead
                runtime.set_members("j", ["b"])

    with pytest.raises(SystemExit):
        run(train_a, a)
    assert a.step == 4 and runtime.checkpoint_generation("j") == 1
    committed = {k: v.clone() for k, v in a.model.state_dict().items()}

    b = make_state(runtime, "j", "b")
    with torch.no_grad():
        b.model.weight.fill_(0.0)  # a different start: the checkpoint must overwrite it
    seen: list[tuple[int, int]] = []

    def train_b(s: State) -> None:
        seen.append((s.step, s.samples))
        assert all(torch.equal(s.model.state_dict()[k], committed[k]) for k in committed)

    run(train_b, b)
    assert seen == [(4, 12)]
    runtime.forget("j", keep_state=False)
    assert runtime.checkpoint_generation("j") is None


# -- a daemon restart: the store goes away and comes back on the same port ---------------------------

def test_resume_generation_and_reported_generations_keep_numbering_up(runtime: TorchRuntime) -> None:
    runtime.resume_generation("j", 7)
    runtime.resume_generation("j", 3)  # never backwards
    assert runtime.generation("j") == 7
    assert runtime.set_members("j", ["a"]) == 8
    client_store(runtime, "k", "b").set(resume_key("k", "b"), "41")  # what a reconnected worker reports
    assert runtime.set_members("k", ["a", "b"]) == 42
    runtime.forget("k")
    assert not client_store(runtime, "k").check([resume_key("k", "b")])
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="job j: generation"):
            runtime.resume_generation("j", bad)  # type: ignore[arg-type]


def test_store_grace_reaches_workers(runtime: TorchRuntime) -> None:
    assert TorchRuntime(store_grace_s=12.5).store_grace_s == 12.5
    assert runtime.launch_spec("j", ["x"], "w", "n").env[ENV_STORE_GRACE] == repr(runtime.store_grace_s)
    with pytest.raises(ValueError, match="store_grace_s"):
        TorchRuntime(store_grace_s=0)
    env = {ENV_STORE: runtime.address, ENV_JOB: "j", ENV_WORKER: "w", ENV_STORE_GRACE: "nope",
           ENV_JOB_SECRET: runtime.secret_for("j")}
    with pytest.raises(ValueError, match=f"{ENV_STORE_GRACE}='nope'"):
        Rendezvous.from_env(env)
    env[ENV_STORE_GRACE] = "2.5"
    rdzv = Rendezvous.from_env(env)
    assert rdzv is not None and rdzv.grace_s == 2.5 and rdzv.address == ("127.0.0.1", runtime.port)


def reconnecting_state(rt: TorchRuntime, job: str, worker: str, grace_s: float) -> State:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rdzv = make_rdzv(rt, job, worker, address=("127.0.0.1", rt.port), grace_s=grace_s)
    return State(model, opt, rendezvous=rdzv, timeout_s=2.0)


def test_training_rides_through_a_store_restart(runtime: TorchRuntime) -> None:
    """The daemon dies (its store with it) and comes back on the same port: no step is lost."""
    port = runtime.port
    runtime.set_members("j", ["a"])
    state = reconnecting_state(runtime, "j", "a", grace_s=30.0)
    new: list[TorchRuntime] = []
    calls: list[int] = []
    steps_while_away: list[int] = []

    def train(s: State) -> None:
        calls.append(s.step)
        while True:
            _train_steps(s, 1)
            s.commit()  # while the store is away this must neither block nor fail
            if s.step == 2 and not new:
                runtime.close()  # kill -9 of the daemon: its store goes
            elif s.step >= 3 and not new and len(steps_while_away) < 5:
                steps_while_away.append(s.step)
            elif len(steps_while_away) == 5 and not new:
                rt2 = TorchRuntime("127.0.0.1", port)  # the restarted daemon, same port
                rt2.secret_for = runtime.secret_for  # and the same key (the daemon's monitor.key)
                rt2.start()
                rt2.resume_generation("j", 1)  # what its SQLite store remembers
                new.append(rt2)
            elif new and new[0].generation("j") == 1:
                time.sleep(0.05)
                if new[0].ready("j", "a"):  # rank 0 re-registered its world on the new store
                    assert new[0].set_members("j", ["a"]) == 2
            elif new and s.generation == 2 and s.step >= calls[-1] + 2:
                new[0].set_members("j", [])

    try:
        with pytest.raises(SystemExit) as exit_info:
            run(train, state)
        assert exit_info.value.code == 0
        assert steps_while_away == [3, 4, 5, 6, 7]  # trained on while the store was away
        assert calls == [0]  # renumbered at a commit: no rollback, the training function goes on
        assert [(e.kind, e.to_generation) for e in state.rescales] == [("join", 1), ("change", 2), ("leave", 2)]
        assert state._rdzv is not None and state._rdzv.reconnects == 1
        assert client_store(new[0]).get(resume_key("j", "a")) == b"1"
    finally:
        for rt in new:
            rt.close()


def test_store_away_past_the_grace_period_exits_75(runtime: TorchRuntime) -> None:
    runtime.set_members("j", ["a"])
    state = reconnecting_state(runtime, "j", "a", grace_s=0.6)

    def train(s: State) -> None:
        while True:
            _train_steps(s, 1)
            if s.step == 2:
                runtime.close()
            time.sleep(0.01)
            s.commit()

    with pytest.raises(SystemExit) as exit_info:
        run(train, state)
    assert exit_info.value.code == EXIT_STORE_LOST
    assert state.step > 10  # it trained on until the grace period was over
    assert state._rdzv is not None and state._rdzv.lost_for() > 0.6 and state._rdzv.reconnects == 0
    assert [e.kind for e in state.rescales] == ["join", "leave"]  # no rollback, no rescale: it left
    assert not dist.is_initialized()


def test_a_busy_rendezvous_port_falls_back_to_a_free_one(caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rt = TorchRuntime("127.0.0.1", port)
        with caplog.at_level("WARNING"):
            rt.start()
        try:
            assert rt.port not in (0, port)
            assert f"rendezvous port {port} is not free" in caplog.text
        finally:
            rt.close()


def test_checkpoint_larger_than_one_store_value_round_trips_and_is_forgotten(runtime: TorchRuntime) -> None:
    """A 12 MB model: one frame of the store's channel holds at most 1 MiB, so the checkpoint goes in chunks."""
    from malletrain.worker.elastic import Snapshot
    from contract.storekeys import CKPT_CHUNK_BYTES, ckpt_chunk_key, ckpt_tag_key

    weights = torch.arange(3 * 1024 * 1024, dtype=torch.float32)  # 12 MiB
    snap = Snapshot(7, {"w": weights}, None, {"step": 41})
    rdzv = make_rdzv(runtime, "big", "a")
    rdzv.save_checkpoint(snap, 3)
    store = client_store(runtime, "big")
    assert store.check([ckpt_tag_key("big"), ckpt_chunk_key("big", 2)]) and CKPT_CHUNK_BYTES < weights.numel() * 4
    back = make_rdzv(runtime, "big", "b").load_checkpoint()
    assert back is not None and back.version == 7 and back.counters == {"step": 41}
    assert torch.equal(back.model["w"], weights)
    assert runtime.checkpoint_generation("big") == 3
    runtime.forget("big", keep_state=False)
    assert not store.check([ckpt_chunk_key("big", 0)]) and runtime.checkpoint_generation("big") is None


# -- security: the store listens on loopback; a planted checkpoint cannot run code ----------------

def _listening_ips(port: int) -> set[str]:
    import psutil

    return {c.laddr.ip for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_the_store_listens_on_the_given_interface_only(runtime: TorchRuntime) -> None:
    assert _listening_ips(runtime.port) == {"127.0.0.1"}  # not 0.0.0.0 or ::
    assert runtime.bind == "127.0.0.1"
    other = TorchRuntime("127.0.0.1", 0, bind="127.0.0.1")
    other.start()
    try:
        assert _listening_ips(other.port) == {"127.0.0.1"}
    finally:
        other.close()
    with pytest.raises(OSError, match="no-such-host.invalid"):
        TorchRuntime("127.0.0.1", 0, bind="no-such-host.invalid").start()


def _planted_state(marker, form: str) -> bytes:
    """A saved state whose load would run code (make ``marker``), as ``torch.save`` or a bare pickle."""
    import io
    import pickle

    evil = {"version": 1, "model": {"w": _Planted(str(marker))}, "optimizer": None, "counters": {}}
    if form == "torch.save":
        buf = io.BytesIO()
        torch.save(evil, buf)
        return buf.getvalue()
    return pickle.dumps(evil, protocol=2)


class _Planted:
    """Unpickling this runs ``os.mkdir(path)``: the marker of code run by a checkpoint load."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.mkdir, (self.path,)


def _plant(runtime: TorchRuntime, job: str, data: bytes) -> None:
    from contract.storekeys import ckpt_chunk_key, ckpt_header, ckpt_key, ckpt_tag_key

    store = client_store(runtime, job)  # one of the job's own workers (anyone else is refused)
    store.set(ckpt_chunk_key(job, 0), data)
    store.set(ckpt_key(job), ckpt_header(1, len(data)))
    store.set(ckpt_tag_key(job), "1")


@pytest.mark.parametrize("form", ["torch.save", "bare pickle"])
def test_a_planted_checkpoint_does_not_run_code(runtime: TorchRuntime, tmp_path, form: str) -> None:
    import pickle

    from malletrain.worker.elastic import CheckpointError

    marker = tmp_path / "pwned"
    data = _planted_state(marker, form)
    pickle.loads(pickle.dumps(_Planted(str(tmp_path / "control"))))  # the payload does work when unpickled
    assert (tmp_path / "control").is_dir()
    _plant(runtime, "j", data)
    with pytest.raises(CheckpointError, match="job j: stored checkpoint refused by the safe loader"):
        make_rdzv(runtime, "j", "a").load_checkpoint()
    assert not marker.exists()


def test_a_joining_worker_refuses_a_planted_checkpoint(runtime: TorchRuntime, tmp_path) -> None:
    """The whole path: a new world that would start from the stored state does not load the plant."""
    import io

    from malletrain.worker.elastic import CheckpointError

    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"version": 3, "model": {"w": _Planted(str(marker))}, "optimizer": None, "counters": {}}, buf)
    _plant(runtime, "j", buf.getvalue())
    runtime.set_members("j", ["a"])
    state = make_state(runtime, "j", "a")
    with pytest.raises(CheckpointError):
        run(lambda s: None, state)
    assert not marker.exists()
    assert not dist.is_initialized()


def test_checkpoint_bytes_round_trip_plain_data_and_refuse_objects() -> None:
    from malletrain.worker.elastic import CheckpointError, Snapshot, decode_checkpoint, encode_checkpoint

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    snap = Snapshot(4, model.state_dict(), opt.state_dict(),
                    {"step": 9, "epoch": 1, "samples": 36, "extra": {"loss": 0.5, "tag": "x", "hist": [1, 2]}})
    back = decode_checkpoint(encode_checkpoint(snap), "j")
    assert back.version == 4 and back.counters == snap.counters
    assert all(torch.equal(back.model[k], v) for k, v in snap.model.items())
    assert torch.equal(back.optimizer["state"][0]["momentum_buffer"], snap.optimizer["state"][0]["momentum_buffer"])
    odd = Snapshot(1, {}, None, {"step": 1, "epoch": 0, "samples": 1, "extra": {"obj": _Planted("/nonexistent")}})
    with pytest.raises(CheckpointError, match="State.extra"):
        encode_checkpoint(odd)


# -- restarts: fresh workers after a daemon restart, durable checkpoints ------------------------------

def test_a_fresh_worker_joins_whatever_generation_a_restarted_daemon_publishes(runtime: TorchRuntime) -> None:
    """A restarted daemon numbers on from generation 6 in an empty store: a worker it starts fresh
    must join generation 7 (it used to wait for generation 1 forever)."""
    runtime.resume_generation("j", 6)
    state = make_state(runtime, "j", "fresh")
    seen: list[int] = []
    finished = threading.Event()

    def train(s: State) -> None:
        seen.append(s.generation)
        s.step += 1
        s.commit()

    def worker() -> None:
        try:
            run(train, state)
        finally:
            finished.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    wait_until(lambda: runtime.ready("j", "fresh"), "the fresh worker is ready")
    assert runtime.set_members("j", ["fresh"]) == 7
    assert finished.wait(60), "the fresh worker never joined the republished generation"
    assert seen == [7] and state.step == 1


def _leave_with_checkpoint(rt: TorchRuntime, job: str, steps: int) -> dict[str, torch.Tensor]:
    """Worker "a" trains ``steps`` steps; the daemon suspends the job; a leaves its checkpoint."""
    rt.set_members(job, ["a"])
    a = make_state(rt, job, "a")

    def train(s: State) -> None:
        while True:
            _train_steps(s, 1)
            s.commit()
            if s.step == steps:
                rt.set_members(job, [])  # suspended: a leaves at its next commit

    with pytest.raises(SystemExit):
        run(train, a)
    rt.forget(job)  # as the daemon does for a suspended job
    return {k: v.clone() for k, v in a.model.state_dict().items()}


def test_a_suspended_jobs_checkpoint_is_on_disk_and_outlives_the_daemon(tmp_path) -> None:
    """Finding: a job killed while SUSPENDED lost its checkpoint (it lived in the store only)."""
    import stat

    from malletrain.runtimes.torch_elastic import checkpoint_path

    ckpts = tmp_path / "state" / "checkpoints"
    first = TorchRuntime("127.0.0.1", 0, checkpoint_dir=ckpts)
    first.start()
    try:
        committed = _leave_with_checkpoint(first, "j", 3)
        assert first.persist_checkpoints(["j", "other"]) == ["j"]
        assert first.persist_checkpoints(["j"]) == []  # nothing new: not written again
        gen = first.generation("j")
    finally:
        first.close()  # the daemon dies: its store with it
    path = checkpoint_path(ckpts, "j")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(ckpts.stat().st_mode) == 0o700
    assert [p.name for p in ckpts.iterdir()] == ["j.ckpt"]  # no temporary file left

    second = TorchRuntime("127.0.0.1", 0, checkpoint_dir=ckpts)  # the restarted daemon: an empty store
    second.start()
    try:
        second.resume_generation("j", gen)
        b = make_state(second, "j", "b")
        with torch.no_grad():
            b.model.weight.fill_(0.0)  # a different start: the checkpoint must overwrite it
        seen: list[tuple[int, int]] = []

        def train_b(s: State) -> None:
            seen.append((s.step, s.samples))
            assert all(torch.equal(s.model.state_dict()[k], committed[k]) for k in committed)

        publisher = threading.Thread(target=lambda: (wait_until(lambda: second.ready("j", "b"), "b is ready"),
                                                     second.set_members("j", ["b"])), daemon=True)
        publisher.start()
        run(train_b, b)
        publisher.join(30)
        assert seen == [(4, 12)]  # the commit of step 4: a left at its next commit after step 3
        second.forget("j", keep_state=False)  # the job ended
        assert not path.exists()
    finally:
        second.close()


def test_a_damaged_checkpoint_file_is_named_and_skipped(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "j.ckpt").write_bytes(b"malletrain-checkpoint 1 3 999\nshort")
    rt = TorchRuntime("127.0.0.1", 0, checkpoint_dir=ckpts)
    rt.start()
    try:
        rt.resume_generation("j", 3)
        assert rt.checkpoint_generation("j") is None
        assert "j.ckpt: not a checkpoint file of malletrain" in caplog.text
    finally:
        rt.close()


def test_a_half_written_checkpoint_is_not_copied(runtime: TorchRuntime, tmp_path) -> None:
    from contract.storekeys import ckpt_seq_key

    rt = TorchRuntime("127.0.0.1", 0, checkpoint_dir=tmp_path / "ck")
    rt.start()
    try:
        _leave_with_checkpoint(rt, "j", 2)
        store = client_store(rt)
        store.add(ckpt_seq_key("j"), 1)  # a worker is writing a new one (odd)
        assert rt.persist_checkpoints(["j"]) == []
        store.add(ckpt_seq_key("j"), 1)  # done
        assert rt.persist_checkpoints(["j"]) == ["j"]
    finally:
        rt.close()
