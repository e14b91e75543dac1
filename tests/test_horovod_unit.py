"""HorovodRuntime without Horovod: membership files, slot holders, driver lifecycle.

The driver is a fake ``horovodrun`` (a short Python program) so these run
everywhere; tests/test_horovod_runtime.py runs the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from malletrain.runtimes import LaunchSpec, Runtime
from contract.workerenv import ENV_HOROVOD_JOB_DIR as ENV_JOB_DIR
from malletrain.runtimes.horovod_elastic import (
    HorovodRuntime,
    JobPhase,
    hosts_lines,
    job_processes,
)
from contract.horovod import current_generation
from stepping import wait_until

# A stand-in for horovodrun: records its argv and the discovery script's output,
# leaves a grandchild running (to check the tree is cleaned up), then waits for
# a "finish" file holding the exit code to use.
FAKE_HOROVODRUN = r"""
import json, os, subprocess, sys, time
job_dir = os.environ["MALLETRAIN_HOROVOD_JOB_DIR"]
args = sys.argv[1:]
script = args[args.index("--host-discovery-script") + 1]
hosts = subprocess.run([script], capture_output=True, text=True, timeout=10).stdout
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(os.path.join(job_dir, "fake.json"), "w") as out:
    json.dump({"argv": args, "hosts": hosts, "child": child.pid}, out)
finish = os.path.join(job_dir, "finish")
while not os.path.exists(finish):
    time.sleep(0.05)
child.kill()
sys.exit(int(open(finish).read()))
"""

COMMAND = ("python3", "train.py", "--epochs", "1")


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[HorovodRuntime]:
    rt = HorovodRuntime(tmp_path / "rt", horovodrun=(sys.executable, "-c", FAKE_HOROVODRUN))
    rt.start()
    yield rt
    rt.close()


def start_holder(spec: LaunchSpec) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(spec.argv), env={**os.environ, **spec.env}, cwd=spec.cwd)


def fake_record(rt: HorovodRuntime, job: str) -> dict[str, object]:
    path = rt.job_dir(job) / "fake.json"
    wait_until(path.exists, f"{path}", 15.0)
    return json.loads(path.read_text())


def test_implements_runtime_protocol() -> None:
    rt: Runtime = HorovodRuntime()
    assert rt.name == "horovod"


def test_hosts_lines_local_counts_members_on_one_host() -> None:
    assert hosts_lines(["a", "b", "c"], {"a": "n1", "b": "n2", "c": "n3"}, local=True) == ["localhost:3"]
    assert hosts_lines([], {}, local=True) == []


def test_hosts_lines_cluster_one_line_per_node_in_member_order() -> None:
    nodes = {"a": "n2", "b": "n1", "c": "n2"}
    assert hosts_lines(["a", "b", "c"], nodes, local=False) == ["n2:2", "n1:1"]


def test_bad_inputs_name_the_job_and_worker(runtime: HorovodRuntime) -> None:
    with pytest.raises(ValueError, match="job j1: empty command for worker w0"):
        runtime.launch_spec("j1", [], "w0", "n1")
    runtime.launch_spec("j1", COMMAND, "w0", "n1")
    with pytest.raises(ValueError, match="job j1: worker w1 launched with command"):
        runtime.launch_spec("j1", ["other"], "w1", "n1")
    with pytest.raises(KeyError, match="job nope"):
        runtime.set_members("nope", ["w0"])
    with pytest.raises(ValueError, match="job j1: member 'w9' was never launched"):
        runtime.set_members("j1", ["w0", "w9"])
    with pytest.raises(ValueError, match="job j1: member 'w0' listed twice"):
        runtime.set_members("j1", ["w0", "w0"])
    assert runtime.phase("j1") is JobPhase.PENDING


def test_launch_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="start"):
        HorovodRuntime().launch_spec("j1", COMMAND, "w0", "n1")


def test_min_max_np_validated() -> None:
    with pytest.raises(ValueError, match="min_np"):
        HorovodRuntime(min_np=0)
    with pytest.raises(ValueError, match="max_np"):
        HorovodRuntime(min_np=3, max_np=2)


def test_launch_spec_is_a_slot_holder_with_job_env(runtime: HorovodRuntime) -> None:
    spec = runtime.launch_spec("j1", COMMAND, "w0", "n1")
    assert spec.argv[:4] == (sys.executable, "-m", "malletrain.runtimes.horovod_elastic", "hold")
    assert "--worker" in spec.argv and spec.argv[spec.argv.index("--worker") + 1] == "w0"
    assert spec.env == {"MALLETRAIN_JOB": "j1", "MALLETRAIN_WORKER": "w0"}


def test_set_members_rewrites_hosts_and_starts_one_driver(runtime: HorovodRuntime) -> None:
    for w in ("w0", "w1", "w2"):
        runtime.launch_spec("j1", COMMAND, w, f"node-{w}")
    assert runtime.set_members("j1", ["w0", "w1"]) == 1
    record = fake_record(runtime, "j1")
    assert record["hosts"] == "localhost:2\n"
    assert record["argv"] == runtime.driver_argv("j1", 2)[3:]  # after "python -c CODE"
    argv = record["argv"]
    assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("--min-np") + 1] == "1"
    assert argv[argv.index("--network-interfaces") + 1] == "lo"
    assert tuple(argv[-len(COMMAND):]) == COMMAND
    assert runtime.phase("j1") is JobPhase.RUNNING

    assert runtime.set_members("j1", ["w2", "w0", "w1"]) == 2
    hosts = runtime.job_dir("j1") / "hosts"
    assert hosts.read_text() == "localhost:3\n"
    assert current_generation(runtime.job_dir("j1")) == 2
    assert runtime.set_members("j1", ["w1"]) == 3
    assert hosts.read_text() == "localhost:1\n"
    members = json.loads((runtime.job_dir("j1") / "members.json").read_text())
    assert members == {"generation": 3, "members": ["w1"], "hosts": ["localhost:1"], "retired": ["w0", "w2"]}
    # still one driver: the fake recorded one start and is still waiting
    assert runtime.phase("j1") is JobPhase.RUNNING and runtime.exit_code("j1") is None


def test_cluster_hosts_file_has_one_line_per_node(tmp_path: Path) -> None:
    rt = HorovodRuntime(tmp_path / "rt", local=False, horovodrun=(sys.executable, "-c", FAKE_HOROVODRUN))
    rt.start()
    try:
        rt.launch_spec("j1", COMMAND, "a", "nid001")
        rt.launch_spec("j1", COMMAND, "b", "nid002")
        rt.set_members("j1", ["a", "b"])
        assert fake_record(rt, "j1")["hosts"] == "nid001:1\nnid002:1\n"
        assert "--network-interfaces" not in rt.driver_argv("j1", 2)
    finally:
        rt.close()


def test_holders_leave_when_removed_and_end_with_the_job(runtime: HorovodRuntime) -> None:
    holders = {w: start_holder(runtime.launch_spec("j1", COMMAND, w, "n")) for w in ("w0", "w1", "w2")}
    try:
        runtime.set_members("j1", ["w0", "w1"])  # w2 launched ahead of time: must keep holding
        runtime.set_members("j1", ["w0"])
        assert holders["w1"].wait(timeout=15) == 0
        time.sleep(0.5)
        assert holders["w0"].poll() is None and holders["w2"].poll() is None
        runtime.set_members("j1", ["w0", "w2"])
        (runtime.job_dir("j1") / "finish").write_text("3")
        assert runtime.wait("j1", timeout=15) == 3
        assert runtime.exit_code("j1") == 3 and runtime.phase("j1") is JobPhase.EXITED
        assert holders["w0"].wait(timeout=15) == 3
        assert holders["w2"].wait(timeout=15) == 3
        assert job_processes(runtime.job_dir("j1")) == []
    finally:
        for proc in holders.values():
            proc.kill()
            proc.wait(timeout=10)


def test_forget_stops_driver_tree_and_holders(runtime: HorovodRuntime) -> None:
    holder = start_holder(runtime.launch_spec("j1", COMMAND, "w0", "n"))
    try:
        runtime.set_members("j1", ["w0"])
        job_dir = runtime.job_dir("j1")
        grandchild = psutil.Process(int(fake_record(runtime, "j1")["child"]))  # type: ignore[arg-type]
        assert grandchild.is_running()
        runtime.forget("j1")
        runtime.forget("j1")  # idempotent
        assert holder.wait(timeout=15) == 0
        wait_until(lambda: not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE,
                   "the driver's child to end", 15.0)
        assert job_processes(job_dir) == []
        assert not job_dir.exists()
        with pytest.raises(KeyError):
            runtime.phase("j1")
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_current_generation_without_job_dir_is_zero(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_JOB_DIR, raising=False)
    assert current_generation() == 0
    assert current_generation(tmp_path) == 0
    (tmp_path / "members.json").write_text('{"generation": "x"}')
    with pytest.raises(ValueError, match="members.json: field 'generation'"):
        current_generation(tmp_path)


def test_a_new_runtime_readopts_a_running_driver(tmp_path: Path) -> None:
    """A daemon died (kill -9): its driver runs on; the next daemon's runtime takes the job over."""
    fake = (sys.executable, "-c", FAKE_HOROVODRUN)
    old = HorovodRuntime(tmp_path / "rt", horovodrun=fake)
    old.start()
    for w in ("w0", "w1", "w2"):
        old.launch_spec("j1", COMMAND, w, f"n-{w}")
    old.set_members("j1", ["w0", "w1", "w2"])
    old.set_members("j1", ["w0", "w1"])
    job_dir = old.job_dir("j1")
    grandchild = psutil.Process(int(fake_record(old, "j1")["child"]))  # type: ignore[arg-type]
    new = HorovodRuntime(tmp_path / "rt", horovodrun=fake)  # same work dir, as the daemon configures it
    new.start()
    try:
        assert new.readopt("j1", COMMAND, {"w0": "n-w0", "w1": "n-w1"}) == 2
        assert new.readopt("j1", COMMAND, {"w0": "n-w0", "w1": "n-w1"}) == 2  # idempotent
        assert new.job_dir("j1") == job_dir and new.phase("j1") is JobPhase.RUNNING
        assert new.set_members("j1", ["w1"]) == 3  # numbering goes on, no second driver
        record = json.loads((job_dir / "members.json").read_text())
        assert record["retired"] == ["w0", "w2"] and (job_dir / "hosts").read_text() == "localhost:1\n"
        assert len(json.loads((job_dir / "fake.json").read_text())["argv"]) > 0
        assert new.readopt("j2", COMMAND, {"x": "n"}) == 0  # nothing to take over: a fresh job
        assert new.phase("j2") is JobPhase.PENDING
        new.forget("j1")  # stops the adopted driver and everything it started
        wait_until(lambda: not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE,
                   "the adopted driver's child to end", 15.0)
        assert job_processes(job_dir) == []
    finally:
        new.close()
        old.close()
    with pytest.raises(ValueError, match="job j3: empty command"):
        new.readopt("j3", [], {})
