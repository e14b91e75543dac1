"""Every process a job starts ends with it, held by a cgroup where the node has
one (scavenger.containment), even when the agent itself is killed before it can clean up.

The tests that make cgroups need root and a writable hierarchy: elsewhere they skip with the reason
(``MALLETRAIN_REQUIRE_CGROUP=1`` turns the skip into a failure).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scavenger import containment as CT
from scavenger.containment import Mode, Place, places

HYBRID_MOUNTINFO = """\
25 30 0:22 / /sys rw,nosuid - sysfs sysfs rw
33 25 0:29 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
34 33 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
41 33 0:37 / /sys/fs/cgroup/freezer rw,nosuid - cgroup cgroup rw,freezer
44 33 0:40 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
45 33 0:41 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
"""
HYBRID_CGROUP = "8:pids:/user.slice\n6:freezer:/\n2:cpu,cpuacct:/user.slice\n0::/user.slice/session-3.scope\n"


def test_places_reads_the_agents_own_cgroup_in_each_hierarchy_v2_first() -> None:
    assert places(HYBRID_MOUNTINFO, HYBRID_CGROUP) == [
        Place(Mode.V2, Path("/sys/fs/cgroup/unified/user.slice/session-3.scope")),
        Place(Mode.FREEZER, Path("/sys/fs/cgroup/freezer")),
        Place(Mode.PIDS, Path("/sys/fs/cgroup/pids/user.slice")),
    ]


def test_places_maps_a_mount_of_a_subtree_and_skips_one_that_does_not_show_the_agent() -> None:
    mountinfo = ("50 40 0:30 /slurm/uid_7/job_9 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
                 "51 40 0:37 /other /mnt/freezer rw - cgroup cgroup rw,freezer\n")
    proc_cgroup = "0::/slurm/uid_7/job_9/step_0/user/task_0\n6:freezer:/slurm/uid_7/job_9\n"
    assert places(mountinfo, proc_cgroup) == [Place(Mode.V2, Path("/sys/fs/cgroup/step_0/user/task_0"))]


def test_places_is_empty_without_cgroups_and_a_v1_only_node_gets_the_freezer() -> None:
    assert places("25 30 0:22 / /sys rw - sysfs sysfs rw\n", "0::/\n") == []
    v1_only = "41 33 0:37 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n"
    assert places(v1_only, "6:freezer:/batch\n0::/\n") == [Place(Mode.FREEZER, Path("/sys/fs/cgroup/freezer/batch"))]


def test_the_subreaper_is_chosen_when_asked_and_describes_itself() -> None:
    assert "subreaper" in CT.Subreaper(True).description
    assert "may outlive" in CT.Subreaper(False).description
    assert CT.Subreaper(False).sweep(()) == 0 and CT.Subreaper(False).prepare("w") is None


# ---- with real cgroups (root) ---------------------------------------------------------------------


def usable(mode: str) -> str | None:
    """Why ``mode`` cannot be used here (None: it can)."""
    if mode == "subreaper":
        return None
    found = [p for p in CT.own_places() if p.mode.value == mode]
    if not found:
        return f"no {mode} hierarchy mounted for this process"
    try:
        CT.CgroupContainment(found[0], CT.Subreaper(False)).close()
    except OSError as exc:
        return f"{mode} at {found[0].parent} is not writable here ({exc.strerror or exc}; needs root)"
    return None


def skip_unless_usable(mode: str) -> None:
    why = usable(mode)
    if why is None:
        return
    if os.environ.get("MALLETRAIN_REQUIRE_CGROUP") == "1":
        pytest.fail(f"MALLETRAIN_REQUIRE_CGROUP=1 but {why}")
    pytest.skip(why)


CGROUP_MODES = ["cgroup2", "freezer", "pids"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", CGROUP_MODES)
def test_ending_a_worker_kills_every_process_in_its_cgroup_and_removes_it(mode: str) -> None:
    skip_unless_usable(mode)
    place = next(p for p in CT.own_places() if p.mode.value == mode)
    held = CT.CgroupContainment(place, CT.Subreaper(False))
    try:
        join = held.prepare("job/1 w0")
        assert join is not None
        group = held.groups["job/1 w0"].path
        assert group.parent == held.base and "/" not in group.name
        # the child joins between fork and exec as another user (nobody): root's open file lets it in
        proc = subprocess.Popen(
            ["/bin/sh", "-c", "setsid sleep 300 & exec sleep 300"],
            preexec_fn=join, user=65534, group=65534, extra_groups=[], start_new_session=True)
        held.add("job/1 w0", proc.pid)
        pids: list[int] = []
        for _ in range(2000):
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            if len(pids) == 2:
                break
            os.sched_yield()
        assert proc.pid in pids and len(pids) == 2  # the worker and its setsid() child
        assert held.end("job/1 w0") == 2
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert not any(_alive(p) for p in pids) and not group.exists()
    finally:
        held.close()
    assert not held.base.exists()


GRANDCHILD = (
    "import os, subprocess, sys, time\n"
    "code = 'import os, sys, time; os.setsid(); open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(300)'\n"
    "subprocess.Popen([sys.executable, '-c', code, sys.argv[1]])\n"
    "time.sleep(300)\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [*CGROUP_MODES, "subreaper"])
def test_a_grandchild_is_caught_by_its_cgroup_after_the_agent_is_killed_9(tmp_path: Path, mode: str) -> None:
    """The case the subreaper cannot cover: the agent and the worker are killed -9 before any cleanup, the
    setsid() grandchild is re-parented out of the agent's tree; the next agent on the node (or any cleanup
    by the cgroup path) finds it and kills it. With the subreaper alone it survives (shown, then ended)."""
    from test_security_round2 import AgentRig

    skip_unless_usable(mode)
    rig = AgentRig(tmp_path, "--containment", mode)
    grandchild = 0
    try:
        pidfile = tmp_path / "grandchild.pid"
        assert rig.hub.start_worker("node00", "w", (sys.executable, "-c", GRANDCHILD, str(pidfile)), {}, None)
        rig.wait("the grandchild detached", lambda: pidfile.exists() and pidfile.read_text().isdigit())
        grandchild = int(pidfile.read_text())
        worker = next(int(getattr(e, "pid")) for e in rig.events if type(e).__name__ == "WorkerStartedEvent")
        rig.agent.kill()  # SIGKILL: no cleanup of any kind
        rig.agent.wait(timeout=10)
        os.kill(worker, signal.SIGKILL)
        rig.wait("the worker is gone", lambda: not _alive(worker), timeout=10)
        assert _alive(grandchild)  # out of every tree the agent controlled
        # the next agent of the same daemon on the node: it ends the folders of its agents that are gone
        inst = CT.installation_id(Path(rig.hub.key_file).read_bytes())
        subprocess.run([sys.executable, "-c",
                        f"from scavenger import containment as c; c.choose({mode!r}, {inst!r}).close()"],
                       check=True, timeout=60)
        if mode == "subreaper":
            assert _alive(grandchild)  # the gap the cgroup closes
        else:
            rig.wait("the grandchild was found by its cgroup and killed", lambda: not _alive(grandchild), timeout=10)
            parent = next(p.parent for p in CT.own_places() if p.mode.value == mode)
            assert not list(CT.install_dir(parent, inst).glob(f"{CT.AGENT_DIR_PREFIX}{rig.agent.pid}.*"))
    finally:
        if grandchild and _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
        rig.close()


def test_a_stale_folder_of_a_live_agent_is_left_alone(tmp_path: Path) -> None:
    skip_unless_usable("cgroup2")
    place = next(p for p in CT.own_places() if p.mode is Mode.V2)
    held = CT.CgroupContainment(place, CT.Subreaper(False))  # this process is a live agent
    try:
        join = held.prepare("w")
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], preexec_fn=join)
        held.add("w", proc.pid)
        CT.sweep_stale(held.base.parent, Mode.V2)
        assert proc.poll() is None and held.base.exists()
        held.close()
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        held.close()


def _cgroup_of(pid: int) -> str:
    return next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if line.startswith("0::"))


def test_a_warm_process_joins_the_workers_cgroup_before_it_learns_the_job_and_one_that_refuses_is_handed_back(
        tmp_path: Path) -> None:
    from test_warm import KEY, SCRIPT, wait_ready

    from scavenger import protocol as P
    from scavenger.agent import Agent

    skip_unless_usable("cgroup2")
    place = next(p for p in CT.own_places() if p.mode is Mode.V2)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT + "import time; time.sleep(300)\n")
    agent = Agent("n1", "tcp://127.0.0.1:1", KEY, log_dir=str(tmp_path / "logs"), warm_modules=("json",))
    agent.containment = CT.CgroupContainment(place, CT.Subreaper(False))
    try:
        assert agent.warm is not None
        agent.warm.prepare()
        wait_ready(agent.warm)
        warm_pid = agent.warm.proc.pid if agent.warm.proc else -1
        outside = _cgroup_of(warm_pid)
        agent.start_worker(P.StartWorker("n1", "j1.n1.1", (sys.executable, str(script)), {}, str(tmp_path)))
        warm = agent.workers["j1.n1.1"].proc
        assert warm.pid == warm_pid and _cgroup_of(warm.pid).endswith("/w1.j1.n1.1")
        # a command the warm process cannot run exactly: it starts cold in its own cgroup, the warm one is handed back
        agent.warm.prepare()
        wait_ready(agent.warm)
        spare = agent.warm.proc.pid if agent.warm.proc else -1
        agent.start_worker(P.StartWorker("n1", "j1.n1.2", (sys.executable, "-u", str(script)), {}, str(tmp_path)))
        cold = agent.workers["j1.n1.2"].proc
        assert cold.pid != spare and _cgroup_of(cold.pid).endswith("/w2.j1.n1.2")
        assert _cgroup_of(spare) == outside
        agent.stop_worker("j1.n1.1", 0.0)
        agent.stop_worker("j1.n1.2", 0.0)
        for proc in (warm, cold):
            proc.wait(timeout=30)
        agent.reap()
        held = agent.containment
        assert isinstance(held, CT.CgroupContainment) and not list(held.base.glob("w*"))  # both removed
    finally:
        agent.kill_all(0.2)
        if agent.warm is not None:
            agent.warm.close()
        agent.containment.close()
        agent.sock.close(0)
        agent.monitor.close(0)
        agent.ctx.term()


@pytest.mark.parametrize("mode", CGROUP_MODES)
def test_an_agent_sweeps_only_its_own_daemons_subtree_never_another_installations_folders(mode: str) -> None:
    """Where cgroups are shared across pid namespaces (containers, a second daemon on the node), an agent
    judged another installation's agent dead by a pid it could not see, and killed its workers: it sweeps
    only the subtree of its own daemon (the id from its agent key)."""
    skip_unless_usable(mode)
    place = next(p for p in CT.own_places() if p.mode.value == mode)
    unseen = f"{CT.AGENT_DIR_PREFIX}4194303.1"  # an agent this pid namespace cannot see (pid_max + 1)
    theirs = [place.parent / unseen, CT.install_dir(place.parent, CT.installation_id(b"b" * 32)) / unseen]
    ours = CT.installation_id(b"a" * 32)
    dead_ours = CT.install_dir(place.parent, ours) / unseen  # one of our own agents, killed -9
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for folder in [*theirs, dead_ours]:
            folder.mkdir(parents=True)
            proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            (folder / "cgroup.procs").write_text(str(proc.pid))
            procs.append(proc)
        # as an agent does it, in a process of its own: choose() makes its caller a subreaper
        subprocess.run([sys.executable, "-c",
                        f"from scavenger import containment as c; c.choose({mode!r}, {ours!r}).close()"],
                       check=True, timeout=60)
        assert all(p.poll() is None for p in procs[:2]) and all(f.exists() for f in theirs)
        assert procs[2].wait(timeout=10) == -signal.SIGKILL and not dead_ours.exists()
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        for folder in [*theirs, dead_ours]:
            CT.kill_cgroup(folder, Mode(mode))
            CT.remove_tree(folder.parent if folder.parent.name.startswith(CT.INSTALL_DIR_PREFIX) else folder)
