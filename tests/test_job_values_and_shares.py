"""What a job, or any local user, can do to the daemon, to other jobs and to the node: every value a
job writes is bounded where it is read, every shared resource has a per-user share. Each test
replays the attack or the fault, and fails on the code before its fix.

Tests that act as another local user need root (they drop to ``nobody``); they are skipped otherwise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from malletrain.daemon.jobspec import JobSpec, JobState
from procs import procs_mentioning
from tests.clusters.floods import SILENT_CONNECTIONS
from tests.stepping import step_until

ROOT = os.geteuid() == 0
NOBODY = 65534
TOY = (sys.executable, "-m", "malletrain.worker.toy")


@pytest.fixture
def toy_daemon(tmp_path: Path) -> Iterator[Any]:
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon

    d = Daemon(DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy",
                            local=LocalConfig(nodes=1, trace="none"), agent_heartbeat=0.2,
                            agent_dead_after=4.0, loop_interval=0.05))
    try:
        yield d
    finally:
        d.close()
    assert procs_mentioning(str(tmp_path / "state")) == []


# ---- a generation a job writes ----------------------------------------------------------------


def test_a_resume_generation_of_2_63_from_a_worker_is_ignored_not_stored() -> None:
    """A worker set its ``resume`` key to 2^63-1: the next generation overflowed SQLite and killed the daemon."""
    from contract.storekeys import resume_key
    from contract.wire import StoreClient
    from malletrain.runtimes.torch_elastic import MAX_RESUMED_GENERATION, TorchRuntime
    rt = TorchRuntime("127.0.0.1", 0, monitor="tcp://127.0.0.1:5999")
    rt.start()
    try:
        rt.launch_spec("j", ["x"], "w", "n")
        client = StoreClient(("127.0.0.1", rt.port), "j", "w", rt.secret_for("j"))
        for bad in (str(2**63 - 1), str(MAX_RESUMED_GENERATION + 1), "-5", "1e9", "9" * 4300):
            client.set(resume_key("j", "w"), bad)
            gen = rt.set_members("j", ["w"])
            assert gen <= 16, bad
        client.set(resume_key("j", "w"), "41")  # a real one is still taken
        assert rt.set_members("j", ["w"]) == 42
    finally:
        rt.close()


def test_an_overflow_acting_on_one_job_fails_that_job_and_the_daemon_goes_on(toy_daemon: Any) -> None:
    d = toy_daemon
    real = d.runtime.set_members

    def overflowing(job_id: str, members: Any) -> int:
        if members and job_id == bad:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return real(job_id, members)

    d.runtime.set_members = overflowing
    bad = d.store.submit(JobSpec("bad", TOY + ("--rate", "1000"), 1, 1))
    step_until(d, lambda: d.store.require(bad).state is JobState.FAILED, 60)
    assert "OverflowError" in (d.store.require(bad).message or "")
    good = d.store.submit(JobSpec("good", TOY + ("--rate", "1000"), 1, 1))
    step_until(d, lambda: d.runs[good].last_progress > 0, 60)  # the same daemon runs the next job


# ---- the rendezvous store's handshaking slots and counters ------------------------------------

VICTIM = (
    "import os, sys\n"
    "from contract.wire import StoreClient\n"
    "c = StoreClient(('127.0.0.1', int(sys.argv[1])), 'victim', 'w0', os.environ['SECRET'])\n"
    "c.set('mt/victim/ready/w0', '1'); print('joined', flush=True)\n"
)


def _as(uid: int | None, *argv: str) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]


@pytest.mark.skipif(not ROOT, reason="acts as two other local users (setpriv needs root)")
def test_one_user_re_opening_silent_connections_does_not_lock_another_user_out_of_the_store() -> None:
    """A local user without a job filled the store's 64 shared handshaking slots in a loop: a victim's
    workers got 'handshake with the store ...: Connection reset by peer' for as long as it lasted."""
    import subprocess

    from malletrain.runtimes.torch_elastic import TorchRuntime

    rt = TorchRuntime("127.0.0.1", 0, monitor="tcp://127.0.0.1:5999")
    rt.start()
    flood = subprocess.Popen(_as(NOBODY, sys.executable, "-c", SILENT_CONNECTIONS, str(rt.port), "300", "60"),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "flooding"
        rt.launch_spec("victim", ["x"], "w0", "n")
        env = {**os.environ, "SECRET": rt.secret_for("victim"), "PYTHONPATH": str(Path(__file__).parents[1])}
        for _ in range(3):  # a victim of another user, while the flood goes on
            res = subprocess.run(_as(1, sys.executable, "-c", VICTIM, str(rt.port)), env=env,
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 0 and "joined" in res.stdout, res.stderr[-800:]
        assert flood.poll() is None and rt.rejected.get("too_many", 0) > 0  # the flood was refused beyond its own share
    finally:
        flood.kill()
        flood.wait(10)
        rt.close()


def test_an_add_on_a_counter_that_is_no_counter_is_refused_named_not_a_traceback() -> None:
    """An ADD on a key holding 4,300 digits raised ValueError in the store's thread (a traceback each)."""
    from contract.storekeys import arrive_key
    from contract.wire import StoreClient, StoreRefused
    from malletrain.runtimes.torch_elastic import TorchRuntime

    rt = TorchRuntime("127.0.0.1", 0, monitor="tcp://127.0.0.1:5999")
    rt.start()
    try:
        rt.launch_spec("j", ["x"], "w", "n")
        c = StoreClient(("127.0.0.1", rt.port), "j", "w", rt.secret_for("j"))
        key = arrive_key("j", 3)
        for held, delta in (("9" * 4300, 1), ("9" * 4299, 1), (str(2**63 - 1), 1), ("12", 10**30)):
            c.set(key, held)
            with pytest.raises(StoreRefused, match="not a counter|not an integer"):
                c.add(key, delta)
        c.set(key, "5")
        assert c.add(key, 2) == 7  # the connection is still served
    finally:
        rt.close()


# ---- claims that move nodes ---------------------------------------------------------------------


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_job_on_one_node_cannot_claim_a_world_of_two_at_a_rate_it_never_trained(fast_path: bool) -> None:
    """A job trained at 1,000/s on one node, then claimed world size 2 at 7,600/s, doubling: the policy took
    the victim's node for it. The world size a report counts at is the daemon's record of the job's members."""
    from contract.messages import Report, new_secret, secret_key
    from malletrain.daemon.monitor import Monitor

    now = [1000.0]
    mon = Monitor(clock=lambda: now[0])
    mon.fast_path = fast_path
    try:
        secret = new_secret()
        key = secret_key(secret)
        mon.register("j", secret, max_nodes=2)
        mon.set_world("j", 1, 1)  # what the daemon published: one node
        seq = 1
        for _ in range(90):  # 90 s at 1,000/s on its one node
            now[0] += 1.0
            mon.ingest(Report("j", seq, 1_000, now[0], 1, 1, "w0").encode(key))
            seq += 1
        for gen in (1, 2, 7):  # then claims of a world of 2 at 7,600/s, in its own and in made-up generations
            for _ in range(60):
                now[0] += 1.0
                mon.ingest(Report("j", seq, 7_600, now[0], 2, gen, "w0").encode(key))
                seq += 1
        st = mon.jobs["j"]
        assert set(st.rates()) == {1} and st.world_size == 1  # nothing measured at a world it was never given
        mon.set_world("j", 8, 2)  # the daemon grows it: its reports now count at 2
        now[0] += 1.0
        mon.ingest(Report("j", seq, 2_000, now[0], 1, 8, "w0").encode(key))
        assert st.world_size == 2
    finally:
        mon.close()


# ---- a checkpoint header a job writes ---------------------------------------------------------


def test_a_checkpoint_header_of_5_million_chunks_is_refused_and_costs_the_daemon_no_key_list(tmp_path: Path) -> None:
    """``ckpt`` = ``chunks:5000000:0``: every loop built a 5M-key list (486 MB), and a cancel froze the daemon."""
    from contract.storekeys import ckpt_key, ckpt_seq_key, ckpt_tag_key, parse_ckpt_header
    from contract.wire import StoreClient
    from malletrain.runtimes.torch_elastic import TorchRuntime

    for bad in (b"chunks:5000000:0", b"chunks:1:5000000000", b"chunks:2:10", b"chunks:" + b"9" * 4300 + b":0"):
        with pytest.raises(ValueError, match="job j: checkpoint header"):
            parse_ckpt_header(bad, "j")
    assert parse_ckpt_header(b"chunks:2:983041", "j") == (2, 983041) and parse_ckpt_header(b"chunks:0:0", "j") == (0, 0)
    rt = TorchRuntime("127.0.0.1", 0, monitor="tcp://127.0.0.1:5999", checkpoint_dir=tmp_path)
    rt.start()
    try:
        rt.launch_spec("j", ["x"], "w", "n")
        c = StoreClient(("127.0.0.1", rt.port), "j", "w", rt.secret_for("j"))
        c.set(ckpt_key("j"), "chunks:5000000:0")
        c.set(ckpt_tag_key("j"), "3")
        c.set(ckpt_seq_key("j"), "2")
        store = rt._store
        assert store is not None
        asked: list[int] = []
        check, delete = store.check, store.delete_key
        store.check = lambda keys: asked.append(len(keys)) or check(keys)  # type: ignore[method-assign]
        store.delete_key = lambda key: asked.append(1) or delete(key)  # type: ignore[method-assign]
        assert rt.persist_checkpoints(["j"]) == []
        rt.forget("j", keep_state=False)  # what a cancel does
        assert max(asked) <= 4 and len(asked) < 100
        assert not store.check([ckpt_key("j")])  # its keys are gone all the same
    finally:
        rt.close()


# ---- a log flood --------------------------------------------------------------------------------

FLOOD_OUT = "import os\nb = b'A' * 65535 + b'\\n'\nfor _ in range(int(os.sys.argv[1])): os.write(1, b)\n"


@pytest.mark.slow
def test_a_log_flood_never_holds_more_than_twice_the_cap_on_disk(tmp_path: Path) -> None:
    """``yes AAAA...`` grew one log to 256 MB (cap 64 MiB) in under 10 s: the agent looked too late."""
    from test_security_round2 import AgentRig

    r = AgentRig(tmp_path, "--log-max-bytes", "100000")
    try:
        sizes: list[int] = []

        def look() -> bool:
            r.tick()
            sizes.extend(f.stat().st_size for f in r.logs.glob("flood.log*"))
            return r.exit_code("flood") is not None

        assert r.hub.start_worker("node00", "flood", (sys.executable, "-c", FLOOD_OUT, "800"), {}, None)
        r.wait("the 52 MB flood ended", look, timeout=120)
        assert r.exit_code("flood") == 0 and max(sizes) <= 100_000
        assert {f.name for f in r.logs.glob("flood.log*")} == {"flood.log", "flood.log.1"}
        assert "log rotated" in (r.logs / "flood.log").read_text()
        assert "AAAA" not in (tmp_path / "agent.log").read_text()
    finally:
        r.close()


def test_a_log_writes_nothing_into_the_disk_reserve_and_resumes_when_there_is_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flood filled the state file system: every other user's submit and cancel then failed."""
    import subprocess

    from scavenger import logpump

    room = {"free": 10 << 20}
    monkeypatch.setattr(logpump, "free_and_reserve", lambda folder: (room["free"], 32 << 20))
    monkeypatch.setattr(logpump, "SPACE_EVERY_S", 0.0)
    pump = logpump.LogPump(tmp_path / "w.log", 64 << 20)
    subprocess.run([sys.executable, "-c", FLOOD_OUT, "16"], stdout=pump.write_end, check=True, timeout=60)
    room["free"] = 1 << 40
    subprocess.run([sys.executable, "-c", "print('after')"], stdout=pump.write_end, check=True, timeout=60)
    pump.close()
    text = (tmp_path / "w.log").read_text()
    assert "AAAA" not in text and "output dropped" in text and "after" in text
    assert pump.dropped == 16 * 65536


# ---- the metrics endpoint ----------------------------------------------------------------------


@pytest.mark.skipif(not ROOT, reason="a scrape as another local user (setpriv needs root)")
def test_a_thousand_idle_connections_to_the_metrics_port_start_no_thousand_threads() -> None:
    """1,000 connections gave the daemon 1,008 threads; and another user's scrape must still be served."""
    import socket
    import subprocess
    import threading

    pytest.importorskip("prometheus_client")
    from malletrain.daemon.metrics import Metrics

    m = Metrics("127.0.0.1:0")
    held: list[socket.socket] = []
    try:
        before = threading.active_count()
        port = int(m.address.rsplit(":", 1)[1])
        for _ in range(300):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        scrape = ("import sys, urllib.request\n"
                  "print(len(urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/metrics', timeout=20).read()))\n")
        res = subprocess.run(_as(NOBODY, sys.executable, "-c", scrape, str(port)), capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0 and int(res.stdout) > 100, res.stderr[-500:]
        assert threading.active_count() - before <= 16
    finally:
        for s in held:
            s.close()
        m.close()


def test_a_short_line_is_in_the_log_as_soon_as_it_is_written(tmp_path: Path) -> None:
    import subprocess

    from scavenger.logpump import LogPump

    pump = LogPump(tmp_path / "w.log", 64 << 20)
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('first', flush=True); time.sleep(60)"],
                            stdout=pump.write_end)
    pump.spawned()
    try:
        import time

        deadline = time.monotonic() + 30
        while "first" not in (tmp_path / "w.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "first" in (tmp_path / "w.log").read_text()
    finally:
        proc.kill()
        proc.wait(10)
        pump.close()


# ---- submit: what the CLI checks as the submitting user -----------------------------------------


def _cli(*args: str, uid: int | None = None, timeout: float = 60) -> Any:
    import subprocess

    argv = [sys.executable, "-m", "malletrain", *args]
    return subprocess.run(_as(uid, *argv) if uid is not None else argv, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user can read (pytest's tmp_path is 0700)."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="mt-submit-"))
    os.chmod(top, 0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_job_file_that_is_a_device_or_a_fifo_is_refused_at_once_naming_it(open_dir: Path) -> None:
    """``/dev/zero`` ran the CLI out of memory; a FIFO hung it."""
    fifo = open_dir / "job.toml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        res = _cli("submit", path, "--state-dir", str(open_dir / "s"), timeout=30)
        assert res.returncode == 2 and path in res.stderr and "not a regular file" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.skipif(not ROOT, reason="submits as another local user (setpriv needs root)")
def test_a_cwd_its_owner_cannot_enter_is_refused_naming_it_without_a_traceback(open_dir: Path) -> None:
    """A cwd under another user's 0700 home gave a PermissionError traceback; ``cwd = "/root"`` was accepted."""
    closed = open_dir / "home"
    (closed / "proj").mkdir(parents=True)
    os.chmod(closed, 0o700)
    for cwd, why in ((closed / "proj", "permission denied"), (closed, "cannot enter it")):
        job = open_dir / "job.toml"
        job.write_text(f'name = "x"\ncommand = ["/bin/true"]\ncwd = "{cwd}"\n')
        os.chmod(job, 0o644)
        res = _cli("submit", str(job), "--state-dir", str(open_dir / "s"), uid=NOBODY)
        assert res.returncode == 2 and str(cwd) in res.stderr and why in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


MISSING = [
    ('["python", "nothere.py"]', "script nothere.py not found"),
    ('["python", "-u", "-X", "dev", "nothere.py", "--lr", "1"]', "script nothere.py not found"),
    ('["python", "-m", "no_such_pkg_here.train"]', "module no_such_pkg_here.train not found"),
    ('["no-such-program-here", "x"]', "command 'no-such-program-here' is not an executable"),
    ('["./train.sh"]', "command './train.sh' is not an executable"),
]
THERE = ['["python", "train.py"]', '["python", "-m", "pkg.train"]', '["python", "-c", "pass"]',
         '["/bin/sh", "-c", "exit 0"]', '["true"]']


def test_submit_refuses_a_command_whose_program_or_script_is_not_there_naming_it(tmp_path: Path) -> None:
    """A job whose script did not exist was accepted, and failed 20 s and five workers later."""
    job = tmp_path / "job.toml"
    (tmp_path / "train.sh").write_text("#!/bin/sh\n")  # there, but not executable
    for command, named in MISSING:
        job.write_text(f'name = "x"\ncommand = {command}\n')
        res = _cli("submit", str(job), "--state-dir", str(tmp_path / "s"))
        assert res.returncode == 2 and named in res.stderr and str(job) in res.stderr, res.stderr
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "train.py").write_text("")
    for command in THERE:  # and what is there is taken
        job.write_text(f'name = "x"\ncommand = {command}\n')
        res = _cli("submit", str(job), "--state-dir", str(tmp_path / "s"))
        assert res.returncode == 0, (command, res.stderr)


def test_status_into_a_closed_pipe_ends_without_a_traceback(tmp_path: Path) -> None:
    """``malletrain status | head`` ended in a BrokenPipeError traceback."""
    import subprocess

    from malletrain.daemon.store import Store

    store = Store.open(tmp_path / "s" / "store.db")
    for i in range(30):
        store.submit(JobSpec(f"job{i}", ("true",), 1, 1))
    store.close()
    proc = subprocess.Popen([sys.executable, "-m", "malletrain", "status", "--state-dir", str(tmp_path / "s")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


# ---- a warm worker looks like a cold one ---------------------------------------------------------

LOOKS = """
import ctypes, json, os, subprocess, sys, tempfile
ps = subprocess.run(["ps", "-o", "args=", "-p", str(os.getpid())], capture_output=True, text=True).stdout.strip()
print(json.dumps({"ps": ps, "environ": open("/proc/self/environ", "rb").read().decode(errors="replace"),
                  "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), "tmp": tempfile.gettempdir(),
                  "comm": open("/proc/self/comm").read().strip()}))
"""


@pytest.mark.skipif(not ROOT, reason="a root warm process that runs the job as another user")
def test_a_warm_worker_shows_its_command_and_environment_is_dumpable_and_follows_tmpdir() -> None:
    """Warm workers differed from cold ones: non-dumpable, TMPDIR ignored (an import had cached the agent's),
    ``ps`` showed ``scavenger.warm --fd 13``, ``/proc/PID/environ`` root's HOME and PATH."""
    import json
    import shutil
    import tempfile

    from scavenger.warm import Assignment, WarmSlot, start_time_env
    from test_warm import wait_ready

    work = Path(tempfile.mkdtemp(prefix="mt-warm-looks-"))
    try:
        work.chmod(0o755)
        (work / "cachetmp.py").write_text("import tempfile\ntempfile.gettempdir()\n")  # as torch's import does
        script = work / "looks.py"
        script.write_text(LOOKS)
        script.chmod(0o644)
        own_tmp = work / "tmp"
        own_tmp.mkdir(mode=0o777)
        own_tmp.chmod(0o777)
        slot = WarmSlot(("cachetmp",))
        slot.env = {**slot.env, "PYTHONPATH": str(work), "HOME": "/root"}
        slot.prepare()
        try:
            wait_ready(slot)
            log_path = work / "w.log"
            with log_path.open("ab") as log:
                env = {**start_time_env(slot.env), "PATH": "/usr/bin:/bin", "TMPDIR": str(own_tmp), "X": "1"}
                proc = slot.take(Assignment((sys.executable, str(script), "--lr", "0.1"), env, str(work),
                                            NOBODY, NOBODY), log)
                assert not isinstance(proc, str), proc
                assert proc.wait(timeout=60) == 0, log_path.read_text()
        finally:
            slot.close()
        seen = json.loads(next(line for line in log_path.read_text().splitlines() if line.startswith("{")))
        assert "scavenger.warm" not in seen["ps"] and f"{script} --lr 0.1" in seen["ps"], seen["ps"]
        assert seen["comm"] == "looks.py"
        assert "HOME=/root" not in seen["environ"] and "X=1" in seen["environ"]
        assert seen["dumpable"] == 1 and seen["tmp"] == str(own_tmp)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- progress that no longer exists -------------------------------------------------------------


def test_a_world_with_no_survivor_and_no_checkpoint_is_known_to_start_from_step_0() -> None:
    from contract.storekeys import ckpt_key, ckpt_seq_key, ckpt_tag_key
    from contract.wire import StoreClient
    from malletrain.runtimes.torch_elastic import TorchRuntime

    rt = TorchRuntime("127.0.0.1", 0, monitor="tcp://127.0.0.1:5999")
    rt.start()
    try:
        for w in ("a", "b", "c", "d"):
            rt.launch_spec("j", ["x"], w, "n")
        rt.set_members("j", ["a"])
        assert not rt.restarted_from_scratch("j")  # the first world: nothing was counted yet
        rt.set_members("j", ["a", "b"])
        assert not rt.restarted_from_scratch("j")  # a grows into b: b joins a's state
        rt.set_members("j", ["c"])  # both died, c replaces them: no checkpoint to start from
        assert rt.restarted_from_scratch("j")
        c = StoreClient(("127.0.0.1", rt.port), "j", "c", rt.secret_for("j"))
        c.set(ckpt_key("j"), "chunks:0:0")
        c.set(ckpt_tag_key("j"), "3")
        c.set(ckpt_seq_key("j"), "2")
        rt.set_members("j", ["d"])  # c died too, but it left a checkpoint
        assert not rt.restarted_from_scratch("j")
    finally:
        rt.close()


def test_the_daemon_drops_the_count_of_progress_a_restart_from_step_0_lost(toy_daemon: Any) -> None:
    """A dead lone worker was replaced and restarted at step 0, while the daemon kept its 43k samples."""
    d = toy_daemon
    jid = d.store.submit(JobSpec("j", TOY + ("--rate", "4000"), 1, 1))
    step_until(d, lambda: d.runs[jid].last_progress > 2000 and d.store.require(jid).samples > 2000, 60)
    run = d.runs[jid]
    d.runtime.restarted_from_scratch = lambda job: job == jid  # what the torch runtime says of such a world
    d.act.publish(run, list(run.members), d.clock())  # (the replacement's world, published)
    assert run.last_progress == 0 and d.store.require(jid).samples == 0
    assert any(e["kind"] == "progress_lost" and e["samples"] > 2000 for e in d.store.events())
    del d.runtime.restarted_from_scratch
    step_until(d, lambda: 0 < d.runs[jid].last_progress and d.store.require(jid).samples > 0, 60)


# ---- the shipped systemd unit --------------------------------------------------------------------


def test_the_shipped_unit_lets_the_agents_make_cgroups_in_its_delegated_subtree() -> None:
    """``ProtectControlGroups=yes`` made /sys/fs/cgroup read-only: agents under systemd fell back to the
    subreaper, which a setsid() grandchild of a worker killed with its agent outlives."""
    unit = (Path(__file__).parents[1] / "docs" / "malletrain.service").read_text()
    settings = [line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#")]
    values = {k.strip(): v.strip() for k, v in settings}
    assert values.get("ProtectControlGroups", "no") == "no" and values.get("Delegate") == "yes"
