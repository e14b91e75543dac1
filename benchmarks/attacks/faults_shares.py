"""Attacks on what a job writes and on shared resources, for ``benchmarks/attacks/bench_faults.py`` (part
``shares``), and its neighbours.

Against real root daemons (local backend), each attack as it was reported:

* **job crashes** (J; daemon down: JD): a job, with its own secret, writes into the rendezvous store
  what the daemon reads: a ``resume`` generation of 2^63-1 and of 2^64 (then ``ready``), a checkpoint
  header of 5,000,000 chunks, an ``add`` on a counter of 4,300 digits. Down (one count each) if the
  daemon died, did not answer ``status`` within 5 s, or died within 10 s of a restart.
* **lockouts** (L; victims delayed: LV): a local user without a job (uid 65533) re-opens 300 silent connections to
  the store in a loop; meanwhile another user's (nobody's) job must reach the store (its worker sets a key and
  says so in its log) within 30 s, or it counts as delayed.
* **evictions** (E; victims evicted: EV): on two nodes, a job that trains 1,000/s on its one node for
  70 s (a toy worker) then also signs reports with its own secret claiming a world of two at 7,600/s,
  doubling every 62 s. The victim (one node) must keep its node: evicted if it is ever suspended or without nodes.
* **log floods** (G; disk full: GF): on a 300 MiB state file system, a job writes its log as fast as it
  can for 20 s. Full (one count each) if the file system ever had less than 4 MiB free, a log held
  more than twice its cap, or another user's submit or cancel failed meanwhile.

**Neighbours** (:class:`Neighbours`): two more daemons, each with its own state dir, ports and agent
key, each running a job of its own, for the whole run: a job of theirs that stops training or loses a
worker (another installation's agent sweeping their cgroups) counts as lost.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import faults_common as B

from malletrain.daemon.control import ControlError, ask
from tests.clusters.floods import SILENT_CONNECTIONS

CONFIG = """
state_dir = "{{state}}"
runtime = "{runtime}"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 6.0
backend = "local"
[local]
nodes = {nodes}
trace = "none"
"""

PY_JOB = """
name = "{name}"
command = [{py}, "-c", {code}]
min_nodes = {lo}
max_nodes = {hi}
env = {{ PYTHONPATH = {root} }}
"""

STORE_WRITE = """
import os, sys, time
from contract.wire import StoreClient, StoreError
host, port = os.environ["MALLETRAIN_STORE"].rsplit(":", 1)
job, me = os.environ["MALLETRAIN_JOB"], os.environ["MALLETRAIN_WORKER"]
c = StoreClient((host, int(port)), job, me, os.environ["MALLETRAIN_JOB_SECRET"])
for key, value, op in {writes}:
    try:
        if op == "add":
            c.add(key.format(job=job, me=me), int(value))
        else:
            c.set(key.format(job=job, me=me), value)
    except StoreError as exc:
        print("refused:", exc, flush=True)
print("attacked", flush=True)
time.sleep(300)
"""

ATTACKS = {
    "resume 2^63-1": [("mt/{job}/resume/{me}", str(2**63 - 1), "set"), ("mt/{job}/ready/{me}", "1", "set")],
    "resume 2^64": [("mt/{job}/resume/{me}", str(2**64), "set"), ("mt/{job}/ready/{me}", "1", "set")],
    "5M-chunk checkpoint": [("mt/{job}/ckpt", "chunks:5000000:0", "set"), ("mt/{job}/ckpt_tag", "3", "set"),
                            ("mt/{job}/ckpt_seq", "2", "set")],
    "4,300-digit counter": [("mt/{job}/arrive/7", "9" * 4300, "set"), ("mt/{job}/arrive/7", "1", "add")],
}

VICTIM = STORE_WRITE.replace("{writes}", '[("mt/{job}/ready/{me}", "1", "set")]').replace(
    'print("attacked"', 'print("joined"')


LIAR = """
import os, subprocess, sys, time, zmq
from contract.messages import Report, secret_key
job, me = os.environ["MALLETRAIN_JOB"], os.environ["MALLETRAIN_WORKER"]
worker = subprocess.Popen([sys.executable, "-m", "malletrain.worker.toy", "--rate", "1000"])  # joins, reports
key = secret_key(os.environ["MALLETRAIN_JOB_SECRET"])
push = zmq.Context.instance().socket(zmq.PUSH)
push.connect(os.environ["MALLETRAIN_MONITOR"])
seq, start = 10 ** 9, time.monotonic()
while worker.poll() is None:
    age = time.monotonic() - start
    if age >= 70:  # then the false claims: a world of two, at 7,600/s, doubling every 62 s
        push.send(Report(job, seq, int(7600 * 2 ** ((age - 70) // 62)), time.time(), 2, 10 ** 6, me).encode(key))
        seq += 1
    time.sleep(1.0)
"""

FULL_BELOW = 4 << 20
"""A state file system with less free space than this is full (SQLite's next write may fail)."""
FLOOD = "import os\nb = b'A' * 65535 + b'\\n'\nend = __import__('time').monotonic() + 20\n" \
        "while __import__('time').monotonic() < end: os.write(1, b)\nimport time; time.sleep(300)\n"


OTHER_PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else B.PY
"""The interpreter of the jobs another local user submits (the store client needs the standard library only)."""


FLOODER = B.NOBODY - 1
"""A local user without a job (not the victim's user, nobody): uid 65533."""


@dataclass
class Shares:
    crashes: int = 0
    crash_down: int = 0
    lockouts: int = 0
    delayed: int = 0
    evictions: int = 0
    evicted: int = 0
    floods: int = 0
    full: int = 0


def _py_job(name: str, code: str, lo: int = 1, hi: int = 1, other_user: bool = False) -> str:
    """A job running ``code`` with this Python; ``other_user``: with :data:`OTHER_PY`, which another
    user can run (this interpreter may live in root's home), importing malletrain from this tree."""
    return PY_JOB.format(name=name, py=json.dumps(OTHER_PY if other_user else B.PY), code=json.dumps(code), lo=lo,
                         hi=hi, root=json.dumps(str(B.ROOT)))


def _log_of(d: B.Daemon, jid: str) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((d.state / "logs").glob(f"{jid}.*.log*")))


def _answers(d: B.Daemon, limit_s: float = 5.0) -> bool:
    """The daemon answers a ``status`` request on its control socket within ``limit_s``, asked from here
    (the CLI's own start, several seconds on a loaded machine, is not the daemon's)."""
    try:
        return d.alive() and ask(d.state, {"cmd": "status"}, limit_s) is not None
    except ControlError:
        return False


def _store_port(d: B.Daemon) -> int:
    with sqlite3.connect(f"file:{d.state / 'store.db'}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'ports'").fetchone()
    return int(json.loads(row[0])["rendezvous"])


# ---------------------------------------------------------------- the attacks
def job_crashes(t: B.Tally, r: Shares) -> None:
    with B.workdir("mt-faults-crash-") as top:
        d = B.Daemon(top, CONFIG.format(runtime="torch", nodes=2))
        d.start()
        try:
            for name, writes in ATTACKS.items():
                jid = B.submit_file(d, f"crash{r.crashes}", _py_job(f"crash{r.crashes}",
                                                               STORE_WRITE.replace("{writes}", repr(writes))))
                r.crashes += 1
                wrote = B.wait(lambda j=jid: "attacked" in _log_of(d, j) or not d.alive(), 60)
                time.sleep(5.0)  # a few loops that read what it wrote
                up = _answers(d)
                if up:
                    d.stop()
                    d.start()
                    time.sleep(10.0)
                    up = _answers(d)
                state = d.jobs()[jid]["state"] if up else "?"
                print(f"  {name}: {'written' if wrote else 'NOT written'}; daemon {'up' if up else 'DOWN'} "
                      f"(the job: {state})", flush=True)
                if not up:
                    r.crash_down += 1
                    t.note(f"shares: a job's {name} took the daemon down")
                    if d.alive():  # it stopped answering but runs: stopped, to start a fresh one on its state dir
                        t.tracebacks += d.stop() != 0
                    d.start()
                d.cancel(jid)
        finally:
            rc = d.stop()
            t.tracebacks += rc != 0
            t.orphans += d.orphans()


def lockouts(t: B.Tally, r: Shares) -> None:
    with B.workdir("mt-faults-lockout-") as top:
        d = B.Daemon(top, CONFIG.format(runtime="torch", nodes=2))
        d.start()
        flood = subprocess.Popen(["setpriv", f"--reuid={FLOODER}", f"--regid={FLOODER}", "--clear-groups", OTHER_PY,
                                  "-c", SILENT_CONNECTIONS, str(_store_port(d)), "300", "60"], cwd="/",
                                 stdout=subprocess.DEVNULL)
        r.lockouts += 1
        try:
            time.sleep(5.0)
            began = time.monotonic()
            jid = B.submit_file(d, "victim", _py_job("victim", VICTIM, other_user=True), as_nobody=True)
            joined = B.wait(lambda: "joined" in _log_of(d, jid), 30)
            print(f"  a silent-connection flood of the store: another user's job "
                  f"{'reached it in %.1f s' % (time.monotonic() - began) if joined else 'did NOT reach it in 30 s'}",
                  flush=True)
            if not joined:
                r.delayed += 1
                t.note(f"shares: a store flood kept another user's job out: {_log_of(d, jid)[-300:]}")
            d.cancel(jid)
        finally:
            flood.kill()
            flood.wait(30)
            B.stop_and_count(d, t)


def evictions(t: B.Tally, r: Shares) -> None:
    with B.workdir("mt-faults-evict-") as top:
        d = B.Daemon(top, CONFIG.format(runtime="toy", nodes=2))
        d.start()
        try:
            victim = d.submit(B.TOY_JOB.format(name="victim", rate=1000, lo=1, hi=1, profile="false", samples=""),
                              "victim")
            B.wait(lambda: d.jobs()[victim]["samples"] > 0, 60)
            liar = B.submit_file(d, "liar", _py_job("liar", LIAR, 1, 2))
            if not B.wait(lambda: d.jobs()[liar]["state"] == "running", 60):
                t.note(f"shares: the lying job never ran ({d.jobs()[liar]['state']}): no eviction was tried")
            r.evictions += 1
            worst, end = "", time.monotonic() + 200  # 70 s of history, then the false claims, doubling
            while time.monotonic() < end:
                j = d.jobs()[victim]
                if j["state"] != "running" or not j["nodes"]:
                    worst = f"{j['state']} with {len(j['nodes'])} node(s) ({j['message']})"
                    break
                time.sleep(1.0)
            print(f"  a job claiming a world of two at 7,600/s (doubling): the victim "
                  f"{'was ' + worst if worst else 'kept its node'}; the liar holds {len(d.jobs()[liar]['nodes'])} "
                  "node(s)", flush=True)
            if worst:
                r.evicted += 1
                t.note(f"shares: a job's false claims evicted another: {worst}")
            d.cancel(liar)
            d.cancel(victim)
        finally:
            B.stop_and_count(d, t)


@contextmanager
def small_fs(path: Path, size: str = "300m") -> Iterator[bool]:
    """A tmpfs of ``size`` at ``path`` (False, and a plain folder, where it cannot be mounted)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                             capture_output=True, timeout=30).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def log_floods(t: B.Tally, r: Shares) -> None:
    from scavenger.jobproc import LOG_MAX_BYTES

    with B.workdir("mt-faults-flood-") as top, small_fs(top / "state") as mounted:
        d = B.Daemon(top, CONFIG.format(runtime="toy", nodes=2))
        d.start()
        try:
            jid = B.submit_file(d, "flood", _py_job("flood", FLOOD))
            r.floods += 1
            problems: list[str] = []
            end = time.monotonic() + 30
            while time.monotonic() < end:
                st = os.statvfs(d.state)
                if st.f_bavail * st.f_frsize < FULL_BELOW:
                    problems.append(f"{st.f_bavail * st.f_frsize} bytes free")
                big = [p for p in (d.state / "logs").glob("*.log*") if p.stat().st_size > 2 * LOG_MAX_BYTES]
                problems += [f"{p.name} holds {p.stat().st_size} bytes" for p in big]
                other = B.submit_file(d, "other", _py_job("other", "print(1)", other_user=True),
                                as_nobody=True) if not problems else ""
                if other:
                    res = B.cli("cancel", other, "--state-dir", str(d.state), as_nobody=True)
                    if res.returncode != 0:
                        problems.append(f"another user's cancel failed: {res.stderr.strip()[-200:]}")
                if problems:
                    break
                time.sleep(1.0)
            used = sum(p.stat().st_size for p in (d.state / "logs").glob("*.log*"))
            print(f"  a 20-s log flood on a {'300 MiB file system' if mounted else 'plain folder (no tmpfs)'}: "
                  f"logs hold {used / 2**20:.0f} MiB; {'; '.join(problems) or 'submits and cancels went on'}",
                  flush=True)
            if problems:
                r.full += 1
                t.note(f"shares: a log flood: {problems[0]}")
            d.cancel(jid)
        except RuntimeError as exc:  # a submit that failed: the disk was full
            r.full += 1
            t.note(f"shares: during a log flood {exc}")
        finally:
            B.stop_and_count(d, t)


def part_shares(t: B.Tally, r: Shares) -> None:
    print("shares: a job's values the daemon reads; a store lockout; false world claims; a log flood", flush=True)
    if os.geteuid() != 0:
        t.note("shares: not root: the attacks as other users were not tried")
        return
    job_crashes(t, r)
    lockouts(t, r)
    evictions(t, r)
    log_floods(t, r)


# ---------------------------------------------------------------- the neighbours
class Neighbours:
    """Two more daemons on this machine, each its own installation running a job of its own."""

    def __init__(self, count: int = 2) -> None:
        self.stack = ExitStack()
        self.daemons: list[tuple[B.Daemon, str]] = []
        self.count = count

    def __enter__(self) -> "Neighbours":
        for i in range(self.count):
            top = self.stack.enter_context(B.workdir(f"mt-faults-neighbour{i}-"))
            d = B.Daemon(top, CONFIG.format(runtime="toy", nodes=2))
            d.start()
            jid = d.submit(B.TOY_JOB.format(name=f"neighbour{i}", rate=500, lo=2, hi=2, profile="false",
                                             samples=""), f"neighbour{i}")
            self.daemons.append((d, jid))
        for d, jid in self.daemons:
            B.wait(lambda d=d, jid=jid: d.jobs()[jid]["samples"] > 0, 120, 1.0)
        print(f"neighbours: {self.count} other daemons, each running a job of its own on 2 nodes", flush=True)
        return self

    def check(self, t: B.Tally) -> None:
        """Their jobs still run and train, and none of their workers failed or was stopped from outside."""
        for d, jid in self.daemons:
            j = d.jobs()[jid] if d.alive() else {"state": "daemon down", "samples": 0}
            failed = [e for e in _events(d, jid) if e in ("worker_failed", "worker_stopped", "node_lost")]
            if j["state"] != "running" or not B.trains(d, jid, 60) or failed:
                t.lost += 1
                t.note(f"neighbours: {jid} of {d.top.name} is {j['state']}, events {failed[:5]}")
        print(f"  neighbours' jobs: {[d.jobs()[j]['samples'] for d, j in self.daemons if d.alive()]} samples",
              flush=True)

    def __exit__(self, *exc: object) -> None:
        for d, _ in self.daemons:
            d.stop()
            d.orphans()
        self.stack.close()


def _events(d: B.Daemon, jid: str) -> list[str]:
    with sqlite3.connect(f"file:{d.state / 'store.db'}?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("SELECT kind FROM events WHERE job = ?", (jid,))]


def summary(r: Shares) -> str:
    """The counts bench_faults' last line adds."""
    return (f"{r.crashes} job-crash attempts, {r.crash_down} daemon down, {r.lockouts} lockouts, "
            f"{r.delayed} victims delayed, {r.evictions} evictions, {r.evicted} victims evicted, "
            f"{r.floods} log floods, {r.full} disk full")
