"""Issue K ("no way in, round two"), findings 2 to 10: each test replays the attack or the fault.

Tests that act as another local user need root (they drop to ``nobody`` with ``setpriv``, or
the agent drops to it); they are skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from malletrain.daemon.config import ConfigError, check_files, parse_config

ROOT = os.geteuid() == 0
NOBODY = 65534


# ---- 9: config ------------------------------------------------------------------------------


def test_admin_groups_is_accepted_as_documented_and_checked_at_config_check(tmp_path: Path) -> None:
    cfg = parse_config({"admin_groups": ["nogroup", 7]})
    assert cfg.admin_groups == ("nogroup", 7)
    check_files(cfg)
    f = tmp_path / "d.toml"
    f.write_text('runtime = "toy"\nadmin_groups = ["no-such-group-here"]\n')
    res = subprocess.run([sys.executable, "-m", "malletrain", "config", "check", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "admin_groups" in res.stderr and "no-such-group-here" in res.stderr
    with pytest.raises(ConfigError, match="admin_groups must be a list"):
        parse_config({"admin_groups": "wheel"})


@pytest.mark.parametrize("method", [True, "fastest", 3])
def test_policy_method_is_checked_at_config_check(method: object) -> None:
    with pytest.raises(ConfigError, match="policy.method"):
        parse_config({"policy": {"method": method}})


# ---- 8, 9: the state dir --------------------------------------------------------------------


def test_a_pre_existing_open_state_dir_is_tightened_with_its_keys_checkpoints_and_logs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from malletrain.daemon.store import Store

    state = tmp_path / "state"
    (state / "checkpoints").mkdir(parents=True)
    (state / "logs").mkdir()
    for f in ("agent.key", "monitor.key", "checkpoints/j000001.ckpt", "logs/j000001.n0.w.log"):
        (state / f).write_bytes(b"x")
        os.chmod(state / f, 0o644)
    for d in (state, state / "checkpoints", state / "logs"):
        os.chmod(d, 0o755)
    Store.open(state / "store.db").close()
    assert state.stat().st_mode & 0o777 == 0o700
    for f in ("agent.key", "monitor.key", "checkpoints", "checkpoints/j000001.ckpt", "logs", "logs/j000001.n0.w.log"):
        assert (state / f).stat().st_mode & 0o077 == 0, f


def test_the_0711_a_root_daemon_sets_is_not_open_and_draws_no_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from malletrain.daemon.store import Store

    state = tmp_path / "state"
    state.mkdir()
    (state / "agent.key").write_bytes(b"k")
    os.chmod(state, 0o711)
    with caplog.at_level("WARNING"):
        Store.open(state / "store.db").close()
    assert state.stat().st_mode & 0o777 == 0o711  # the CLI leaves the daemon's mode alone
    assert "open to other users" not in caplog.text


def test_a_bad_ports_entry_in_the_store_names_the_file(tmp_path: Path) -> None:
    from malletrain.daemon.store import Store, StoreError

    store = Store.open(tmp_path / "store.db")
    try:
        assert store.ports(("monitor",)) == {"monitor": 0}
        for bad in ("[1, 2]", "{not json", '{"monitor": "x"}', '{"monitor": 70000}'):
            store.set_meta("ports", bad)
            with pytest.raises(StoreError, match=str(tmp_path / "store.db")):
                store.ports(("monitor", "agents"))
    finally:
        store.close()


@pytest.mark.skipif(not ROOT, reason="root ignores file modes: needs root to act as another user")
def test_a_daemon_on_a_read_only_state_dir_says_so_without_a_traceback(tmp_path: Path) -> None:
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="mt-ro-"))
    try:
        os.chmod(top, 0o755)
        state = top / "state"
        state.mkdir()
        os.chown(state, NOBODY, NOBODY)
        os.chmod(state, 0o555)
        cfg = top / "d.toml"
        cfg.write_text(f'state_dir = "{state}"\nruntime = "toy"\n[local]\nnodes = 1\ntrace = "none"\n')
        res = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                              sys.executable, "-m", "malletrain", "daemon", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=60, cwd="/")
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        assert f"state dir {state}: cannot write to it" in res.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ---- 7: repeated errors ---------------------------------------------------------------------


def test_a_repeating_error_is_written_once_per_window_with_the_count_held_back() -> None:
    import io
    import logging

    from malletrain.daemon.logs import RepeatFilter, setup_logging

    now = [0.0]
    buf = io.StringIO()
    handler = setup_logging("text", "info", stream=buf)
    handler.filters.clear()
    handler.addFilter(RepeatFilter(window_s=30.0, clock=lambda: now[0]))
    log = logging.getLogger("malletrain.test_k")
    try:
        for i in range(300):  # 30 s of a store write failing ten times a second
            now[0] = i / 10
            try:
                raise OSError(28, "No space left on device")
            except OSError:
                log.exception("reconcile step failed")
            log.info("tick %d", i)
        now[0] = 31.0
        log.error("reconcile step failed")  # the same template, after the window
    finally:
        logging.getLogger().removeHandler(handler)
    text = buf.getvalue()
    assert text.count("Traceback") == 1
    assert text.count("reconcile step failed") == 2 and "299 more like this" in text
    assert text.count("tick ") == 300  # INFO is never held back


# ---- 2, 4, 6, 7, 8: what the agent gives a job --------------------------------------------

GRANDCHILD = (
    "import os, subprocess, sys, time\n"
    "code = 'import os, sys, time; os.setsid(); open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(300)'\n"
    "subprocess.Popen([sys.executable, '-c', code, sys.argv[1]])\n"
    "time.sleep(300)\n"
)


class AgentRig:
    """A real agent process (``python -m scavenger.agent``) on an in-process hub, with a log dir."""

    def __init__(self, tmp: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        from scavenger.hub import AgentHub
        from test_agent_auth import start_agent

        self.tmp = tmp
        self.logs = tmp / "logs"
        self.hub = AgentHub(dead_after_s=30.0)
        self.agent = start_agent(self.hub.address, self.hub.key_file, tmp / "agent.log", "--dead-after", "30",
                                 "--log-dir", str(self.logs), *extra, env=env)
        self.events: list[object] = []
        self.wait("agent up", lambda: any(type(e).__name__ == "AgentUp" for e in self.events))

    def tick(self) -> None:
        self.events.extend(self.hub.poll(50))

    def wait(self, what: str, pred, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        from stepping import wait_until

        wait_until(pred, what, timeout, tick=self.tick, pause=0)

    def exit_code(self, worker: str) -> int | None:
        for e in self.events:
            if type(e).__name__ == "WorkerExitedEvent" and getattr(e, "worker") == worker:
                return int(getattr(e, "code"))
        return None

    def run(self, worker: str, argv: tuple[str, ...], env: dict[str, str] | None = None, cwd: str | None = None,
            uid: int | None = None, gid: int | None = None) -> int:
        """Start ``worker`` and wait for its exit code."""
        assert self.hub.start_worker("node00", worker, argv, env or {}, cwd, uid, gid)
        self.wait(f"{worker} exited", lambda: self.exit_code(worker) is not None)
        return self.exit_code(worker)  # type: ignore[return-value]

    def log(self, worker: str) -> str:
        return (self.logs / f"{worker}.log").read_text(errors="replace")

    def close(self) -> None:
        from test_agent_auth import stop

        stop(self.agent)
        self.hub.close()


@pytest.fixture
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    r = AgentRig(tmp_path, env={"MT_DAEMON_ONLY_SECRET": "hunter2"})
    try:
        yield r
    finally:
        r.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("containment", ["subreaper", "cgroup2", "freezer", "pids"])
def test_a_setsid_grandchild_ends_with_its_job(tmp_path: Path, containment: str) -> None:
    """Finding 6: a job's grandchild that calls setsid() ran 22 s after the cancel (with every backend)."""
    from test_containment import skip_unless_usable

    skip_unless_usable(containment)
    rig = AgentRig(tmp_path, "--containment", containment)
    try:
        pidfile = rig.tmp / "grandchild.pid"
        assert rig.hub.start_worker("node00", "w", (sys.executable, "-c", GRANDCHILD, str(pidfile)), {}, None)
        rig.wait("the grandchild detached", lambda: pidfile.exists() and pidfile.read_text().isdigit())
        grandchild = int(pidfile.read_text())
        assert _alive(grandchild) and os.getsid(grandchild) == grandchild  # its own session: killpg misses it
        expected = "subreaper (" if containment == "subreaper" else f"{containment} cgroups at "
        assert f"containment: {expected}" in (tmp_path / "agent.log").read_text()
        if containment != "subreaper":  # born in the worker's cgroup
            assert "/malletrain-agent." in Path(f"/proc/{grandchild}/cgroup").read_text()
        rig.hub.stop_worker("node00", "w", grace=0.5)
        rig.wait("the worker exited", lambda: rig.exit_code("w") is not None)
        rig.wait("the grandchild ended with the job", lambda: not _alive(grandchild), timeout=10)
        assert rig.agent.poll() is None
    finally:
        rig.close()


@pytest.mark.slow
def test_the_job_env_is_an_allowlist_plus_its_own_env(rig: AgentRig) -> None:
    """Finding 4: a variable set only for the daemon showed up in another user's job."""
    assert rig.run("w", ("/usr/bin/env",), {"MY_JOB_VAR": "mine"}) == 0
    env = dict(line.split("=", 1) for line in rig.log("w").splitlines() if "=" in line)
    assert env["MY_JOB_VAR"] == "mine" and "MT_DAEMON_ONLY_SECRET" not in env
    assert set(env) <= {"MY_JOB_VAR", "PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "HOME", "USER", "LOGNAME",
                        "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
                        "LOCAL_RANK", "LOCAL_WORLD_SIZE"} | {  # the worker's slot on its node
        k for k in env if k.startswith(("LC_", "NCCL_", "GLOO_"))}
    if ROOT:  # as another user: nothing of root's, a plain PATH, the owner's HOME
        assert rig.run("w2", ("/usr/bin/env",), {}, uid=NOBODY, gid=NOBODY) == 0
        env = dict(line.split("=", 1) for line in rig.log("w2").splitlines() if "=" in line)
        assert "MT_DAEMON_ONLY_SECRET" not in env and "PYTHONPATH" not in env
        assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and env["USER"] == "nobody"


@pytest.mark.slow
@pytest.mark.skipif(not ROOT, reason="needs root to run a job as another user")
def test_cwd_is_entered_as_the_owner_so_a_private_dir_or_a_swapped_link_is_refused(rig: AgentRig) -> None:
    """Finding 2: cwd was checked as root and entered before the privilege drop."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="mt-cwd-"))
    try:
        os.chmod(top, 0o755)
        home = top / "victim"  # another user's 0700 home...
        home.mkdir(mode=0o700)
        project = home / "project"  # ...with a folder open inside it: unreachable by name, not once entered
        project.mkdir(mode=0o755)
        (project / "secret-plans.txt").write_text("x")
        link = top / "link"
        link.symlink_to(top)  # checked at submit: a directory nobody may enter...
        os.unlink(link)
        link.symlink_to(project)  # ...swapped for the private one before the job starts
        for name, cwd in (("direct", str(project)), ("swapped", str(link))):
            code = rig.run(name, ("/bin/ls", "-a"), {}, cwd=cwd, uid=NOBODY, gid=NOBODY)
            assert code == 126, (name, code, rig.log(name))
            assert "secret-plans" not in rig.log(name) and "cannot enter its cwd" in rig.log(name)
        assert rig.run("own", ("/bin/pwd",), {}, cwd=str(top), uid=NOBODY, gid=NOBODY) == 0
        assert rig.log("own").strip() == str(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.slow
def test_worker_logs_are_private_capped_and_rotated_and_command_lines_stay_out_of_the_agent_log(
        tmp_path: Path) -> None:
    """Findings 7 and 8: one job filled the disk through its log; logs/ was 0755 and logs 0644 under
    umask 022; the agent log held every user's command line, and a newline in one forged a line."""
    old = os.umask(0o022)
    try:
        r = AgentRig(tmp_path, "--log-max-bytes", "100000")
    finally:
        os.umask(old)
    try:
        flood = (sys.executable, "-c", "import sys\nfor _ in range(100): sys.stdout.write('x' * 9999 + '\\n')\n",
                 "\n2026-11-26 00:00:00,000 INFO agent pid 1: node node00: forged line")
        assert r.run("big", flood) == 0
        r.wait("the last rotation checked", lambda: True)
        assert (r.logs / "big.log").stat().st_size <= 200_000
        assert (r.logs / "big.log.1").stat().st_size <= 100_000
        assert r.logs.stat().st_mode & 0o077 in (0, 0o011)  # 0700, or 0711 for root: never listable
        for f in ("big.log", "big.log.1"):
            assert (r.logs / f).stat().st_mode & 0o777 == 0o600
        text = (tmp_path / "agent.log").read_text()
        assert "forged line" not in text and "x" * 100 not in text
        assert "worker big started" in text
    finally:
        r.close()


def test_prune_keeps_the_log_folder_under_its_quota_oldest_first(tmp_path: Path) -> None:
    from scavenger.jobproc import prune_logs

    for i in range(10):
        f = tmp_path / f"j{i}.log"
        f.write_bytes(b"x" * 1000)
        os.utime(f, (1000 + i, 1000 + i))
    live = tmp_path / "j0.log"
    deleted = prune_logs(tmp_path, [live], max_total=4500, min_age_s=60, now=5000)
    assert live.exists() and sorted(p.name for p in deleted) == ["j1.log", "j2.log", "j3.log", "j4.log", "j5.log",
                                                                  "j6.log"]


# ---- 3: ownerless jobs ----------------------------------------------------------------------


@pytest.mark.skipif(not ROOT, reason="only a root daemon switches users")
def test_a_root_daemon_refuses_a_job_without_a_recorded_owner_instead_of_running_it_as_root() -> None:
    from types import SimpleNamespace

    from malletrain.daemon.act import Act

    with pytest.raises(ValueError, match="no recorded owner"):
        Act._run_as(SimpleNamespace(owner=(None, None)))  # type: ignore[arg-type]
    assert Act._run_as(SimpleNamespace(owner=(NOBODY, NOBODY))) == (NOBODY, NOBODY)  # type: ignore[arg-type]


# ---- 10: what a job's own reports may claim -------------------------------------------------


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_job_cannot_report_more_progress_than_its_nodes_could_train(fast_path: bool) -> None:
    """Finding 10: 8.6e9 samples, signed with the job's own secret, were accepted as progress."""
    from contract.messages import Report, new_secret, secret_key
    from malletrain.daemon.monitor import MAX_RATE_PER_NODE, Monitor

    now = [1000.0]
    mon = Monitor(clock=lambda: now[0])
    mon.fast_path = fast_path
    try:
        secret = new_secret()
        key = secret_key(secret)
        mon.register("j", secret, max_nodes=2)
        mon.register("other", new_secret(), max_nodes=2)
        now[0] += 10.0  # 10 s at 2 nodes: at most 2e7 samples
        mon.ingest(Report("j", 1, 2**31 - 1, now[0], 2, 0, "w0").encode(key))
        mon.ingest(Report("j", 2, int(2 * MAX_RATE_PER_NODE * 10) + 1, now[0], 2, 0, "w0").encode(key))
        assert mon.counts()["implausible"] == 2 and mon.jobs["j"].samples == 0
        mon.ingest(Report("j", 3, 5_000, now[0], 2, 0, "w0").encode(key))  # a real one
        for seq in range(4, 40):  # a steady stream of claims at 10x the bound
            now[0] += 1.0
            mon.ingest(Report("j", seq, int(20 * MAX_RATE_PER_NODE), now[0], 2, 0, "w0").encode(key))
        st = mon.jobs["j"]
        assert st.samples <= 2 * MAX_RATE_PER_NODE * (now[0] - 1000.0)  # never more than the nodes could do
        assert mon.counts()["accepted"] >= 1 and mon.jobs["other"].samples == 0
    finally:
        mon.close()


def _steady(mon, key, seq: int, seconds: int, nodes: int, per_node: int, now: list[float]) -> int:  # type: ignore[no-untyped-def]
    """Report ``per_node`` samples/s per node on ``nodes`` nodes, one report a second; the next seq."""
    from contract.messages import Report

    for _ in range(seconds):
        now[0] += 1.0
        mon.ingest(Report("j", seq, per_node * nodes, now[0], nodes, 0, "w0").encode(key))
        seq += 1
    return seq


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_job_that_trained_at_1000_per_node_cannot_claim_100_times_that(fast_path: bool) -> None:
    """Finding 10, round two: the bound is relative to what the job has shown, not only absolute."""
    from contract.messages import Report, new_secret, secret_key
    from malletrain.daemon.monitor import Monitor
    from malletrain.daemon.ratebound import HistoryBound

    now = [1000.0]
    mon = Monitor(clock=lambda: now[0], history=HistoryBound(factor=4.0, min_reports=20, min_seconds=30.0))
    mon.fast_path = fast_path
    try:
        secret = new_secret()
        key = secret_key(secret)
        mon.register("j", secret, max_nodes=8)
        seq = _steady(mon, key, 1, 60, 2, 1_000, now)  # a minute at 1,000 samples/s per node on 2 nodes
        assert mon.counts()["implausible"] == 0 and mon.jobs["j"].bound.best_per_node == pytest.approx(1_000)
        before = mon.jobs["j"].samples
        now[0] += 10.0  # 10 s later: a claim of 10^5/s per node (far under the absolute 10^6)
        mon.ingest(Report("j", seq, 100_000 * 2 * 10, now[0], 2, 0, "w0").encode(key))
        assert mon.counts()["implausible"] == 1 and mon.jobs["j"].samples == before
        seq = _steady(mon, key, seq + 1, 30, 2, 100_000, now)  # and a steady stream of such claims
        gained = mon.jobs["j"].samples - before
        assert gained <= 4 * 1_000 * 2 * (120 + 2 * 40)  # its bank, 4x its rate (doubled at most once): not 100x
        assert mon.counts()["implausible"] >= 20
    finally:
        mon.close()


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize(("before", "after", "per_node_after"), [(2, 4, 1_000), (2, 16, 1_000), (8, 1, 6_000)])
def test_a_job_that_scales_up_or_down_is_not_refused(fast_path: bool, before: int, after: int,
                                                     per_node_after: int) -> None:
    """The relative bound is per node of the current world size: twice (or 8x) the nodes at 1,000 samples/s per
    node is twice (8x) the rate; and a job that scales poorly (8 nodes at 1,000 each) does 6,000 on one node."""
    from contract.messages import new_secret, secret_key
    from malletrain.daemon.monitor import Monitor

    now = [1000.0]
    mon = Monitor(clock=lambda: now[0])
    mon.fast_path = fast_path
    try:
        secret = new_secret()
        key = secret_key(secret)
        mon.register("j", secret, max_nodes=16)
        seq = _steady(mon, key, 1, 90, before, 1_000, now)
        assert mon.jobs["j"].bound.best_per_node > 0  # it has a history: the relative bound applies
        _steady(mon, key, seq, 300, after, per_node_after, now)  # 5 minutes on the new world size
        assert mon.counts()["implausible"] == 0 and mon.counts()["accepted"] == 390
    finally:
        mon.close()


def test_the_history_bound_names_a_bad_setting() -> None:
    from malletrain.daemon.ratebound import HistoryBound

    for bad in ({"factor": 0.5}, {"factor": float("nan")}, {"min_reports": 1}, {"bank_s": -1.0}, {"factor": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            HistoryBound(**bad)  # type: ignore[arg-type]


# ---- 5: descriptors -------------------------------------------------------------------------

FLOOD = (
    "import socket, sys, time\n"
    "host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
    "held = []\n"
    "for _ in range(n):\n"
    "    s = socket.create_connection((host, port), timeout=5)\n"
    "    held.append(s)\n"
    "print('connected', len(held), flush=True)\n"
    "time.sleep(float(sys.argv[4]))\n"
    "for s in held: s.setblocking(False)\n"
    "def closed(s):\n"
    "    while True:\n"
    "        try:\n"
    "            if s.recv(4096) == b'': return True\n"
    "        except BlockingIOError: return False\n"
    "        except OSError: return True\n"
    "print('cut', sum(closed(s) for s in held), flush=True)\n"
)


@pytest.mark.slow
@pytest.mark.skipif(not ROOT, reason="needs root to act as another local user")
def test_one_user_holding_many_connections_to_the_monitor_is_capped_and_reports_still_arrive() -> None:
    """Finding 5: ~1,000 idle connections from one user drove the root daemon to EMFILE."""
    import time

    from contract.messages import Report, new_secret, secret_key
    from malletrain.daemon.monitor import Monitor
    from scavenger.connguard import PER_PEER

    mon = Monitor()
    try:
        host, port = mon.address.rsplit("/", 1)[1].rsplit(":", 1)
        n = PER_PEER + 150
        flood = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                  sys.executable, "-c", FLOOD, host, port, str(n), "4"],
                                 stdout=subprocess.PIPE, text=True, cwd="/")
        try:
            deadline = time.monotonic() + 60
            while flood.poll() is None and time.monotonic() < deadline:
                mon.drain(timeout_ms=20)
            out, _ = flood.communicate(timeout=30)
        finally:
            if flood.poll() is None:
                flood.kill()
        assert f"connected {n}" in out
        cut = int(out.split("cut ")[1])
        assert cut >= n - PER_PEER and mon.guard.cut["per_peer"] >= n - PER_PEER
        secret = new_secret()
        mon.register("j", secret, max_nodes=1)
        import zmq

        push = mon.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(mon.address)
        time.sleep(1.0)  # the monitor's rate bound: 1 s of one node
        push.send(Report("j", 1, 10, time.time(), 1, 0, "w0").encode(secret_key(secret)))
        deadline = time.monotonic() + 10
        while mon.jobs["j"].reports == 0 and time.monotonic() < deadline:
            mon.drain(timeout_ms=50)
        push.close(0)
        assert mon.jobs["j"].reports == 1
    finally:
        mon.close()


SHED = r"""
import json, logging, os, resource, socket, sys
from pathlib import Path

from malletrain.daemon.control import ControlServer, socket_path

class Count(logging.Handler):
    def __init__(self):
        super().__init__()
        self.failures = 0
    def emit(self, record):
        self.failures += "accept failed" in record.getMessage()

handler = Count()
logging.getLogger("malletrain.daemon.control").addHandler(handler)
logging.getLogger("malletrain.daemon.control").setLevel(logging.WARNING)
state = Path(sys.argv[1])
server = ControlServer(socket_path(state), lambda req, caller: {"ok": True})
clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(5)]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(clients[-1].fileno() + 40, 64), hard))
fillers = []
while True:
    try:
        fillers.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
for c in clients:
    c.connect(str(socket_path(state)))
server.serve(0.3)
dropped = []
for c in clients:
    c.settimeout(2)
    dropped.append(c.recv(1) == b"")
for fd in fillers:
    os.close(fd)
print(json.dumps({"failures": handler.failures, "dropped": dropped, "counts": server.counts()}))
"""


def test_the_control_socket_sheds_connections_when_out_of_descriptors_instead_of_spinning(tmp_path: Path) -> None:
    """Run in a process of its own: running out of descriptors is the whole process's state, and in the test
    process another thread (an earlier test's) may take or free a descriptor in between (it failed so)."""
    import json

    res = subprocess.run([sys.executable, "-c", SHED, str(tmp_path)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert 1 <= out["failures"] <= 5, out  # shed once each, no busy loop
    assert all(out["dropped"]), out  # dropped: the listener is not left readable
    assert out["counts"]["no_descriptors"] >= 1, out


def test_the_daemon_raises_its_descriptor_limit() -> None:
    import resource

    from scavenger.connguard import raise_nofile_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        got = raise_nofile_limit(4096)
        assert got == min(4096, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(not ROOT, reason="only a root daemon switches users")
def test_a_root_daemon_runs_no_other_users_job_with_a_runtime_that_runs_commands_beside_it() -> None:
    """Horovod's driver runs the job's command in a process of the daemon's (root's): another user's
    job would run as root."""
    from types import SimpleNamespace

    from malletrain.daemon.act import Act
    from malletrain.runtimes.horovod_elastic import HorovodRuntime

    assert HorovodRuntime.COMMAND_BESIDE_DAEMON
    with pytest.raises(ValueError, match="beside the daemon"):
        Act._run_as(SimpleNamespace(owner=(NOBODY, NOBODY)), True)  # type: ignore[arg-type]
    assert Act._run_as(SimpleNamespace(owner=(0, 0)), True) == (0, 0)  # type: ignore[arg-type]


def test_a_liar_raises_its_own_measured_rate_at_most_2x_per_window() -> None:
    """The measured rate is the job's own claims: a window raises it by at most ``growth``, whether the liar
    claims 100x (most refused) or just under the bound (none refused), so it cannot ratchet up by ``factor``."""
    from itertools import pairwise

    from malletrain.daemon.ratebound import ClaimBound, HistoryBound

    bound = ClaimBound(0.0, max_nodes=4, history=HistoryBound(factor=4.0, min_reports=20, min_seconds=30.0))
    t = 0.0
    for _ in range(41):  # 40 s at 1,000/s per node on 2 nodes (the first report opens the window)
        t += 1.0
        assert bound.refusal(2_000, 2, t) is None
    assert bound.best_per_node == pytest.approx(1_000) and bound.best_rate == pytest.approx(2_000)
    refused = 0
    for _ in range(60):  # claims at 100x for two windows
        t += 1.0
        refused += bound.refusal(200_000, 2, t) is not None
    assert refused >= 45 and bound.best_per_node <= 1_000 * 2 ** 2
    best = [bound.best_per_node]
    for _ in range(5):  # a careful liar: just under 4x its bound, never refused
        for _ in range(30):
            t += 1.0
            assert bound.refusal(int(3.9 * bound.best_per_node * 2), 2, t) is None
        best.append(bound.best_per_node)
    assert all(b2 <= 2.0 * b1 + 1e-9 for b1, b2 in pairwise(best))


def test_an_honest_job_whose_first_window_was_slow_catches_up() -> None:
    """A rescale pause in the first window (rate 1/10 of the steady one): refused for a few windows at
    most, then every report is taken again (no window is discarded for good)."""
    from malletrain.daemon.ratebound import ClaimBound, HistoryBound

    bound = ClaimBound(0.0, max_nodes=4, history=HistoryBound(factor=4.0, min_reports=20, min_seconds=30.0))
    t = 0.0
    for i in range(41):
        t += 1.0
        bound.refusal(2_000 if i < 4 else 0, 2, t)  # 4 s of training, then a 36 s pause
    assert 0 < bound.best_rate < 400
    refused_late = 0
    for i in range(600):  # 10 minutes at the steady 2,000/s
        t += 1.0
        refused_late += bound.refusal(2_000, 2, t) is not None and i >= 300
    assert refused_late == 0
