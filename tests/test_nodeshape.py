"""Whole nodes: a node's K worker slots (from Slurm's Gres, PBS's ngpus, or the config), each
worker process's own device, cores and local rank, the collectives by device, and K processes
of a node that end together (a failure of one ends the others, reported once)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from malletrain.daemon.config import ConfigError, parse_config
from malletrain.worker.elastic.devices import collective_backend, local_slot, place_in
from contract.workerenv import WorkerEnvError, torchrun_environ
from scavenger import protocol as P
from scavenger.agent import Agent
from scavenger.base import CommandResult
from contract.nodeshape import NodeShapeError, job_slots, node_slots, parse_gres_gpus, pbs_ngpus
from spawner.slots import Accelerator, detect_accelerator, slot_place
from scavenger.pbs import node_info
from scavenger.slurm import SlurmConfig, SlurmDialect

KEY = b"k" * 32


# ---------------------------------------------------------------- what the scheduler reports
@pytest.mark.parametrize("gres, gpus", [
    ("gpu:4", 4), ("gpu:a100:4(S:0-1)", 4), ("gpu:2,gpu:v100:2", 4), ("shard:8,gpu:4", 4),
    ("gpu:a100:2(S:0-1),shard:8", 2), ("(null)", None), ("", None), ("shard:8", None),
])
def test_slurm_gres_gives_the_node_s_gpus(gres: str, gpus: int | None) -> None:
    assert parse_gres_gpus(gres) == gpus


def test_a_gres_gpu_entry_without_a_count_is_named() -> None:
    with pytest.raises(NodeShapeError, match="gpu:a100:x"):
        parse_gres_gpus("gpu:a100:x")


def test_sinfo_reports_each_node_s_gpus() -> None:
    reply = "n1|idle|gpu:4\nn2|idle|(null)\nn3|allocated|gpu:a100:4(S:0-1)\n"
    res = CommandResult(["sinfo"], 0, reply, "", 0.0)
    nodes = {n.name: n.gpus for n in SlurmDialect(SlurmConfig(partition="p")).parse_nodes(res)}
    assert nodes == {"n1": 4, "n2": None, "n3": 4}


def test_pbsnodes_reports_each_vnode_s_ngpus() -> None:
    with_gpus = node_info("v1", {"state": "free", "resources_available": {"ncpus": 1, "ngpus": 4}})
    without = node_info("v2", {"state": "free", "resources_available": {"ncpus": 1}})
    assert with_gpus.gpus == 4 and without.gpus is None
    with pytest.raises(NodeShapeError, match="ngpus"):
        pbs_ngpus({"resources_available": {"ngpus": "four"}})


def test_k_is_the_scheduler_s_gpus_else_the_config_else_one_and_a_job_may_ask_fewer() -> None:
    assert node_slots(4, None) == 4 and node_slots(4, 2) == 4  # the scheduler's word wins
    assert node_slots(None, 2) == 2 and node_slots(0, 3) == 3
    assert node_slots(None, None) == 1
    assert job_slots(4, None) == 4 and job_slots(4, 1) == 1 and job_slots(2, 8) == 2


def test_config_workers_per_node_is_an_int_or_gpus() -> None:
    assert parse_config({}).scavenger.workers_per_node == "gpus"
    assert parse_config({"scavenger": {"workers_per_node": 2}}).scavenger.workers_per_node == 2
    for bad in (0, "all", 1.5, True):
        with pytest.raises(ConfigError, match="workers_per_node"):
            parse_config({"scavenger": {"workers_per_node": bad}})


# ---------------------------------------------------------------- each slot's own part
def test_k_ranks_of_a_node_get_distinct_devices_cores_and_local_ranks() -> None:
    cores = list(range(16))
    places = [slot_place(i, 4, Accelerator.CUDA, {}, cores, {}) for i in range(4)]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in places] == ["0", "1", "2", "3"]
    assert [p.env["LOCAL_RANK"] for p in places] == ["0", "1", "2", "3"]
    assert {p.env["LOCAL_WORLD_SIZE"] for p in places} == {"4"}
    assert [p.cores for p in places] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert {p.env["OMP_NUM_THREADS"] for p in places} == {"4"}  # cores / K, not a pool of all 16 each


def test_the_devices_the_pilot_was_given_are_shared_out_and_each_vendor_has_its_variable() -> None:
    given = {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert [slot_place(i, 2, Accelerator.CUDA, given, [0, 1], {}).env["CUDA_VISIBLE_DEVICES"]
            for i in range(2)] == ["4", "5"]
    amd = slot_place(1, 8, Accelerator.ROCM, {}, range(64), {})
    intel = slot_place(5, 12, Accelerator.XPU, {}, range(96), {})
    assert amd.env["ROCR_VISIBLE_DEVICES"] == "1" and "CUDA_VISIBLE_DEVICES" not in amd.env
    assert intel.env["ZE_AFFINITY_MASK"] == "5" and len(intel.cores) == 8
    assert "CUDA_VISIBLE_DEVICES" not in slot_place(1, 2, Accelerator.NONE, {}, [0, 1], {}).env


def test_a_job_that_sees_all_devices_uses_local_rank_and_its_own_threads_win() -> None:
    place = slot_place(2, 4, Accelerator.CUDA, {}, range(8), {"MALLETRAIN_DEVICES": "all", "OMP_NUM_THREADS": "1"})
    assert "CUDA_VISIBLE_DEVICES" not in place.env and place.env["LOCAL_RANK"] == "2"
    assert "OMP_NUM_THREADS" not in place.env  # the job's own value stays
    with pytest.raises(NodeShapeError, match="MALLETRAIN_DEVICES"):
        slot_place(0, 2, Accelerator.CUDA, {}, [0, 1], {"MALLETRAIN_DEVICES": "some"})


def test_one_slot_changes_nothing_and_fewer_cores_than_slots_still_gives_each_one() -> None:
    one = slot_place(0, 1, Accelerator.CUDA, {}, range(8), {})
    assert one.env == {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert [slot_place(i, 4, Accelerator.NONE, {}, [0, 1], {}).cores for i in range(4)] == [(0,), (1,), (0,), (1,)]


def test_a_node_placed_in_a_world_gives_each_local_rank_its_global_rank() -> None:
    env = {"GROUP_RANK": "2", "GROUP_WORLD_SIZE": "3"}
    ranks = [slot_place(i, 4, Accelerator.NONE, {}, range(4), env).env for i in range(4)]
    assert [e["RANK"] for e in ranks] == ["8", "9", "10", "11"] and {e["WORLD_SIZE"] for e in ranks} == {"12"}


def test_an_agent_s_first_guess_at_k_is_the_devices_it_sees() -> None:
    from spawner.slots import local_device_count
    assert local_device_count(Accelerator.CUDA, {"CUDA_VISIBLE_DEVICES": "2,3"}, ["nvidia0"]) == 2
    assert local_device_count(Accelerator.CUDA, {}, ["nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"]) == 4
    assert local_device_count(Accelerator.XPU, {"ZE_AFFINITY_MASK": "0,1,2"}, []) == 3
    assert local_device_count(Accelerator.NONE, {}, ["null"]) == 1


def test_horovod_gives_each_host_its_node_s_slots() -> None:
    from malletrain.runtimes.horovod_elastic import hosts_lines
    nodes = {"a": "n1", "b": "n2"}
    assert hosts_lines(["a", "b"], nodes, local=False, per_member={"a": 4, "b": 4}) == ["n1:4", "n2:4"]
    assert hosts_lines(["a", "b"], nodes, local=True, per_member={"a": 2, "b": 2}) == ["localhost:4"]


def test_the_accelerator_is_told_by_the_pilot_s_devices_or_dev() -> None:
    assert detect_accelerator({"ROCR_VISIBLE_DEVICES": "0"}, ["nvidia0"]) is Accelerator.ROCM
    assert detect_accelerator({}, ["nvidia0", "nvidiactl"]) is Accelerator.CUDA
    assert detect_accelerator({}, ["kfd", "dri"]) is Accelerator.ROCM
    assert detect_accelerator({}, ["dri", "accel"]) is Accelerator.XPU
    assert detect_accelerator({}, ["null", "nvidiactl"]) is Accelerator.NONE


# ---------------------------------------------------------------- the elastic layer's side
def test_collectives_by_device() -> None:
    assert collective_backend("cuda", {"nccl"}) == "nccl"
    assert collective_backend("xpu", {"nccl", "xccl"}) == "xccl"
    assert collective_backend("cpu", {"nccl"}) == "gloo"
    assert collective_backend("cuda", set()) == "gloo"  # a build without NCCL still trains


def test_each_process_finds_its_rank_from_the_node_members_and_its_local_rank() -> None:
    members = ("w-a", "w-b", "w-c")
    ranks = sorted(place_in(members, w, lr, 2).rank for w in members for lr in range(2))
    assert ranks == list(range(6))
    place = place_in(members, "w-b", 1, 2)
    assert (place.rank, place.world_size) == (3, 6)
    env = torchrun_environ(place, ("10.0.0.1", 1234), "job-1", restart_count=2)
    assert env["RANK"] == "3" and env["WORLD_SIZE"] == "6" and env["LOCAL_RANK"] == "1"
    assert env["GROUP_RANK"] == "1" and env["MASTER_PORT"] == "1234" and env["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert local_slot({}) == (0, 1) and local_slot({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == (1, 2)
    with pytest.raises(WorkerEnvError, match="LOCAL_RANK"):
        local_slot({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"})


# ---------------------------------------------------------------- the agent runs K processes
SHOW = """
import json, os, sys, time
print(json.dumps({"local_rank": os.environ["LOCAL_RANK"], "omp": os.environ.get("OMP_NUM_THREADS"),
                  "cores": sorted(os.sched_getaffinity(0)), "pid": os.getpid()}), flush=True)
if os.environ["LOCAL_RANK"] == sys.argv[1]:
    sys.exit(3)
time.sleep(float(sys.argv[2]))
"""


class _Sent(Agent):
    """An agent whose messages to the daemon are kept (no daemon)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[P.AgentMessage] = []

    def send(self, msg: P.AgentMessage) -> None:  # type: ignore[override]
        self.sent.append(msg)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.startswith("{")]


def _reap_until_exited(agent: _Sent, timeout_s: float = 120.0) -> list[P.WorkerExited]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agent.reap()
        exited = [m for m in agent.sent if isinstance(m, P.WorkerExited)]
        if exited and not agent.workers:
            return exited
        time.sleep(0.05)
    raise TimeoutError(f"the worker did not end within {timeout_s:g} s; sent {agent.sent}")


def test_the_agent_runs_one_process_per_slot_each_on_its_cores(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    agent = _Sent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"))
    try:
        usable = sorted(os.sched_getaffinity(0))
        agent.cores = tuple(usable)
        agent.start_worker(P.StartWorker("n1", "j.n1.1", (sys.executable, str(script), "-1", "0"), {},
                                         str(tmp_path), slots=2))
        exited = _reap_until_exited(agent)
        assert [m.code for m in exited] == [0]
        seen = sorted(_lines(tmp_path / "logs" / "j.n1.1.log"), key=lambda d: d["local_rank"])
        assert [d["local_rank"] for d in seen] == ["0", "1"] and len({d["pid"] for d in seen}) == 2
        if len(usable) >= 2:
            assert seen[0]["cores"] != seen[1]["cores"] and not set(seen[0]["cores"]) & set(seen[1]["cores"])
            assert [int(d["omp"]) for d in seen] == [len(d["cores"]) for d in seen]
    finally:
        agent.kill_all(0.2)
        agent.sock.close(0)


def test_a_crash_of_one_local_rank_ends_its_node_s_ranks_together_counted_once(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    agent = _Sent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"))
    try:
        # local rank 1 fails at once; ranks 0 and 2 would run for 10 minutes
        agent.start_worker(P.StartWorker("n1", "j.n1.1", (sys.executable, str(script), "1", "600"), {},
                                         str(tmp_path), slots=3))
        assert len(agent.workers["j.n1.1"].procs) == 3
        exited = _reap_until_exited(agent)  # the others were stopped: they would run 600 s
        assert [(m.worker, m.code) for m in exited] == [("j.n1.1", 3)]  # once, with the failure's code
        assert len([m for m in agent.sent if isinstance(m, P.WorkerStarted)]) == 1
    finally:
        agent.kill_all(0.2)
        agent.sock.close(0)


def test_a_start_of_k_slots_crosses_the_wire_and_a_bad_count_is_refused() -> None:
    msg = P.StartWorker("n1", "w", ("x",), slots=4)
    assert P.decode(P.encode(msg)).slots == 4  # type: ignore[union-attr]
    bad = json.loads(P.encode(msg))
    bad["payload"]["slots"] = 0
    with pytest.raises(P.ProtocolError, match="slots"):
        P.decode(json.dumps(bad).encode())


def _ready(slot: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        slot.poll()
        if slot.ready:
            return
        time.sleep(0.02)
    raise AssertionError("warm process not ready")


def test_one_warm_process_per_slot_each_becomes_its_local_rank(tmp_path: Path) -> None:
    """An agent told its node has 2 slots keeps 2 warm processes, each on its slot's cores with its
    slot's thread count, and a start of 2 local ranks takes both (no process started cold)."""
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.skip("needs two usable cores")
    agent = _Sent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"), warm_modules=("json",))
    agent.cores = tuple(usable[:2])  # the CPU set the slots share (cores/K = 1 each)
    try:
        agent.learn_slots(2)
        agent.prepare_warm()
        slots = [agent.warm_of(0), agent.warm_of(1)]
        assert all(s is not None for s in slots)
        assert [s.cores for s in slots] == [(usable[0],), (usable[1],)]  # type: ignore[union-attr]
        for s in slots:
            _ready(s)
        pids = [s.proc.pid for s in slots]  # type: ignore[union-attr]
        agent.start_worker(P.StartWorker("n1", "j.n1.1", (sys.executable, str(script), "-1", "0"), {},
                                         str(tmp_path), slots=2))
        assert [p.pid for p in agent.workers["j.n1.1"].procs] == pids  # both warm
        assert [m.code for m in _reap_until_exited(agent)] == [0]
        seen = sorted(_lines(tmp_path / "logs" / "j.n1.1.log"), key=lambda d: d["local_rank"])
        assert [(d["local_rank"], d["omp"], d["pid"]) for d in seen] == [("0", "1", pids[0]), ("1", "1", pids[1])]
    finally:
        agent.kill_all(0.2)
        for s in [agent.warm, *agent.warm_more]:
            if s is not None:
                s.close()
        agent.sock.close(0)


# ---------------------------------------------------------------- the daemon asks each node for K
def test_the_daemon_starts_k_processes_per_node_as_the_scheduler_config_and_job_say(tmp_path: Path) -> None:
    from malletrain.daemon.config import ScavengerConfig
    from malletrain.daemon.jobspec import JobSpec
    from policy import PolicyConfig
    from tests.fakes import FakeCluster
    from tests.test_conformance import LINEAR, NODES, Harness

    cluster = FakeCluster(NODES)
    cluster.gpus = {"n01": 4, "n02": 4}  # n03 and n04: the scheduler says nothing
    h = Harness(tmp_path / "d", PolicyConfig(), cluster, scavenger=ScavengerConfig(workers_per_node=2))
    try:
        cluster.became_idle("n01", "n02", "n03", "n04")
        whole = h.submit("A", LINEAR, max_nodes=4)
        h.run_until(3.0)
        run = h.daemon.runs[whole]
        assert {n: cluster.slots[w] for n, w in run.workers.items()} == {"n01": 4, "n02": 4, "n03": 2, "n04": 2}
        h.daemon.store.request_cancel(whole)
        h.run_until(6.0)
        fewer = h.daemon.store.submit(JobSpec("B", ("true",), 1, 4, scaling=dict(LINEAR), workers_per_node=1))
        h.run_until(10.0)
        workers = h.daemon.runs[fewer].workers
        assert workers and {cluster.slots[w] for w in workers.values()} == {1}
    finally:
        h.close()
