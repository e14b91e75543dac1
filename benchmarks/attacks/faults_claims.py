"""What a job claims about itself, for ``benchmarks/attacks/bench_faults.py`` (parts ``curves``, ``keys`` and
``stopcodes``).

Against real daemons (local backend, toy runtime), each attack as it was reported:

* **curve lies** (C; nodes taken: D): a victim trains on both of two nodes; then a job whose file
  declares ``scaling = { 1 = 1.0, 2 = 1000000.0 }`` (20 samples/s a node in truth) is submitted;
  then, under ``[policy] objective = "samples"``, one declaring a linear curve at a level its steps
  never show (``{ 1 = 1000000.0, 2 = 2000000.0 }``); then, under ``objective = "samples"`` on three
  nodes, another local user's job (``nobody``) with no curve that reports 500,000 samples/s a node
  from its first report (a toy trains nothing) and may grow to all three. Taken (one count each) if,
  within ``seconds``, the liar ever held both nodes or the victim none (two nodes), or the victim
  ever held fewer than its two but while its own profile measured it below (three nodes: the liar may
  have the free one, and a node the victim's probe lends it).
* **key inflations** (E; daemon stalls: F): a ``torchrun`` job whose command stops its rank agent
  (SIGSTOP: it writes its true count no more) and writes the agent's ready key
  (``mt/JOB/ready/WORKER``, WORKER the rank agent's name, not the rank's own: the local-rank count a
  restarted daemon reads) as 10^6, then 200,000,
  again and again; the daemon is killed (-9) and started again. A stall (one
  count each) if the restarted daemon did not answer a ``status`` request on its control socket
  within 5 s at each of 5 looks over 10 s (asked from here: the CLI's own start is not the
  daemon's), or grew past 300 MB. The daemon's agents wait the default ``agent_dead_after``
  (30 s) here: a restart slower than theirs (19 s at load 24) made them stop the job's worker, so
  there was nothing to re-adopt and no key to read. The line says whether the restarted daemon
  read the key (its warning); where it did not, the job's last log lines follow, and the bound
  is shown by ``tests/test_claims.py`` alone.
* **stop-code loops** (G; never failed: H): a job that exits 143, 137, 130, 129 or 75 by itself,
  at once, with ``max_failures = 3``. Never failed (one count each) if the job was not FAILED
  within 60 s.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import faults_common as B
import psutil
import zmq

from malletrain.daemon.control import ControlError, ask

CONFIG = """
state_dir = "{{state}}"
runtime = "{runtime}"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = {dead_after}
max_failures = 3
backend = "local"
[local]
nodes = {nodes}
trace = "none"
"""

LIAR_CURVE = """
name = "liar"
command = ["python", "-m", "malletrain.worker.toy", "--rate", "20", "--alpha", "1.0"]
min_nodes = 1
max_nodes = 2
scaling = {scaling}
"""

OTHER_PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else B.PY
"""The interpreter of another local user's job (this one may live in root's home)."""
SITE = str(Path(zmq.__file__).resolve().parent.parent)
"""This interpreter's site-packages (``zmq``, for the toy's reports), on the other user's job's path."""

JOIN_AND_REPORT = """
import os, time, zmq
from contract.messages import Report, secret_key
from contract.wire import StoreClient
host, port = os.environ["MALLETRAIN_STORE"].rsplit(":", 1)
job, me = os.environ["MALLETRAIN_JOB"], os.environ["MALLETRAIN_WORKER"]
StoreClient((host, int(port)), job, me, os.environ["MALLETRAIN_JOB_SECRET"]).set(f"mt/{job}/ready/{me}", "1")
key = secret_key(os.environ["MALLETRAIN_JOB_SECRET"])
push = zmq.Context.instance().socket(zmq.PUSH)
push.connect(os.environ["MALLETRAIN_MONITOR"])
seq = 1
while True:  # every worker: RATE samples/s, ten reports a second (the daemon counts them at the world it gave)
    push.send(Report(job, seq, RATE // 10, time.time(), 1, 0, me).encode(key))
    seq += 1
    time.sleep(0.1)
"""
"""A torch-runtime job that joins (its ready key) and whose every worker reports ``RATE`` samples/s:
another user's job cannot run the toy runtime's worker (its folder is the daemon's)."""

LEVEL_JOB = """
name = "{name}"
command = [{py}, "-c", {code}]
min_nodes = 1
max_nodes = {hi}
env = {{ PYTHONPATH = {path} }}
"""


def _level_job(name: str, rate: int, hi: int, other_user: bool) -> str:
    py, path = (OTHER_PY, f"{B.ROOT}:{SITE}") if other_user else (B.PY, str(B.ROOT))
    return LEVEL_JOB.format(name=name, py=json.dumps(py), code=json.dumps(JOIN_AND_REPORT.replace("RATE", str(rate))),
                            hi=hi, path=json.dumps(path))


VICTIM = B.TOY_JOB.format(name="victim", rate=1000, lo=1, hi=2, profile="false", samples="")


@dataclass(frozen=True)
class CurveLie:
    what: str
    policy: str
    """The daemon's ``[policy]`` table."""
    liar: str
    """The liar's job file."""
    nodes: int = 2
    as_nobody: bool = False
    """The liar is another local user's (``nobody``'s) job."""
    runtime: str = "toy"
    victim: str = VICTIM


SAMPLES = '[policy]\nobjective = "samples"\n'
CURVE_LIES = (
    CurveLie("a declared curve of {1: 1, 2: 10^6}", "", LIAR_CURVE.replace("{scaling}", "{ 1 = 1.0, 2 = 1000000.0 }")),
    CurveLie("objective samples, a declared level of 10^6 a node", SAMPLES,
             LIAR_CURVE.replace("{scaling}", "{ 1 = 1000000.0, 2 = 2000000.0 }")),
    CurveLie("objective samples, another user's job reporting 500,000/s a node from its first report", SAMPLES,
             _level_job("liar", 500_000, 3, other_user=True), nodes=3, as_nobody=True, runtime="torch",
             victim=_level_job("victim", 1000, 2, other_user=False)),
)
"""Each curve lie."""

INFLATE = """
import os, re, signal, time
from contract.wire import StoreClient, StoreError
host, port = os.environ["MALLETRAIN_STORE"].rsplit(":", 1)
job, me = os.environ["MALLETRAIN_JOB"], os.environ["MALLETRAIN_WORKER"]
agent = re.sub(r"(\\.local\\d+)?\\.restart\\d+$", "", me)  # a rank's name: its agent's, its local rank, its start
c = StoreClient((host, int(port)), job, me, os.environ["MALLETRAIN_JOB_SECRET"])
os.kill(os.getppid(), signal.SIGSTOP)  # its rank agent (same user) writes its true K no more
print("inflating", flush=True)
while True:
    try:
        c.set(f"mt/{job}/ready/{agent}", "{count}")  # the key the daemon reads the agent's K from
    except Exception as exc:  # the daemon killed: its store away, then back on its port
        print("refused:", type(exc).__name__, exc, flush=True)
        try:
            c = StoreClient((host, int(port)), job, me, os.environ["MALLETRAIN_JOB_SECRET"])
        except Exception as again:
            print("reconnect:", type(again).__name__, again, flush=True)
    time.sleep(0.2)
"""

TORCHRUN_JOB = """
name = "{name}"
launcher = "torchrun"
command = [{py}, "-c", {code}]
min_nodes = 1
max_nodes = 1
env = {{ PYTHONPATH = {root} }}
"""

EXIT_JOB = """
name = "exit{code}"
command = [{py}, "-c", "raise SystemExit({code})"]
min_nodes = 1
max_nodes = 1
"""

STALL_MB = 300
DEAD_AFTER = 6.0
"""The agents' ``agent_dead_after`` in the curve and stop-code parts (no restart there)."""
KEYS_DEAD_AFTER = 30.0
"""In the keys part: the daemon's default, so the job's agent outlives the daemon's restart."""


@dataclass
class Claims:
    curve_lies: int = 0
    taken: int = 0
    inflations: int = 0
    stalls: int = 0
    loops: int = 0
    never_failed: int = 0


def curve_lies(t: B.Tally, c: Claims, seconds: float) -> None:
    for lie in CURVE_LIES:
        _curve_lie(t, c, seconds, lie)


def _curve_lie(t: B.Tally, c: Claims, seconds: float, lie: CurveLie) -> None:
    what = lie.what
    with B.workdir("mt-faults-curve-") as top:
        d = B.Daemon(top, CONFIG.format(runtime=lie.runtime, nodes=lie.nodes, dead_after=DEAD_AFTER) + lie.policy)
        d.start()
        try:
            victim = d.submit(lie.victim, "victim")
            if not B.wait(lambda: len(d.jobs()[victim]["nodes"]) == 2, 60):
                t.note(f"claims: the victim never held both nodes: no curve lie was tried ({what})")
                return
            liar = B.submit_file(d, "liar", lie.liar, True) if lie.as_nobody else d.submit(lie.liar, "liar")
            c.curve_lies += 1
            worst, most, end = "", 0, time.monotonic() + seconds
            while time.monotonic() < end:
                jobs = d.jobs()
                most = max(most, len(jobs[liar]["nodes"]))
                if (len(jobs[liar]["nodes"]) == 2 or not jobs[victim]["nodes"]) if lie.nodes == 2 \
                        else len(jobs[victim]["nodes"]) < 2 and jobs[victim]["state"] != "profiling":
                    worst = f"the liar on {len(jobs[liar]['nodes'])}, the victim on {len(jobs[victim]['nodes'])}"
                    break
                time.sleep(1.0)
            print(f"  {what}: {'nodes TAKEN (' + worst + ')' if worst else 'the victim kept its nodes'}; "
                  f"the liar held {most} node(s) at most", flush=True)
            if worst:
                c.taken += 1
                t.note(f"claims: a declared curve took a running job's nodes ({what}): {worst}")
            d.cancel(liar)
            d.cancel(victim)
        finally:
            B.stop_and_count(d, t)


def _daemon_mb(d: B.Daemon) -> float:
    try:
        return psutil.Process(d.proc.pid).memory_info().rss / 2**20 if d.proc is not None else 0.0
    except psutil.Error:
        return 0.0


def _answers_in(d: B.Daemon, limit_s: float = 5.0) -> bool:
    """The daemon answers a ``status`` request on its control socket within ``limit_s``."""
    try:
        return d.alive() and ask(d.state, {"cmd": "status"}, limit_s) is not None
    except ControlError:
        return False


def key_inflations(t: B.Tally, c: Claims) -> None:
    with B.workdir("mt-faults-keys-") as top:
        d = B.Daemon(top, CONFIG.format(runtime="toy", nodes=1, dead_after=KEYS_DEAD_AFTER))
        d.start()
        try:
            for count in (10**6, 200_000):
                code = INFLATE.replace("{count}", str(count))
                jid = d.submit(TORCHRUN_JOB.format(name=f"inflate{count}", py=json.dumps(B.PY), code=json.dumps(code),
                                                   root=json.dumps(str(B.ROOT))), f"inflate{count}")
                logs = lambda j=jid: "".join(p.read_text(errors="replace")  # noqa: E731
                                             for p in (d.state / "logs").glob(f"{j}.*.log*"))
                wrote = B.wait(lambda: "inflating" in logs(), 90)
                time.sleep(2.0)
                c.inflations += 1
                d.kill9()
                t.kills += 1
                d.start()
                looks = []
                for _ in range(5):
                    looks.append(_answers_in(d))
                    time.sleep(2.0)
                mb = _daemon_mb(d)
                state = d.jobs()[jid]["state"] if all(looks) else "?"
                read = d.log.read_text(errors="replace").count(f"says it runs {count} local ranks")
                print(f"  ready key of {count:,} local ranks ({'written' if wrote else 'NOT written'}; "
                      f"{'read and not believed' if read else 'not read'}): {sum(looks)}/5 status answers within "
                      f"5 s after the restart, {mb:.0f} MB (the job: {state})", flush=True)
                if not read:
                    print("    the job's log ends:", logs()[-600:].replace("\n", " | "), flush=True)
                if not all(looks) or mb > STALL_MB:
                    c.stalls += 1
                    t.note(f"claims: a ready key of {count} stalled the restarted daemon ({sum(looks)}/5, {mb:.0f} MB)")
                d.cancel(jid)
                B.wait(lambda j=jid: d.jobs()[j]["state"] == "cancelled", 30)
        finally:
            B.stop_and_count(d, t)


def stop_code_loops(t: B.Tally, c: Claims) -> None:
    with B.workdir("mt-faults-stopcodes-") as top:
        d = B.Daemon(top, CONFIG.format(runtime="toy", nodes=1, dead_after=DEAD_AFTER))
        d.start()
        try:
            for code in (143, 137, 130, 129, 75):
                jid = d.submit(EXIT_JOB.format(code=code, py=json.dumps(B.PY)), f"exit{code}")
                c.loops += 1
                failed = B.wait(lambda j=jid: d.jobs()[j]["state"] == "failed", 60, 0.5)
                j = d.jobs()[jid]
                print(f"  a job exiting {code} by itself: {j['state']} ({j['message'][:80]})", flush=True)
                if not failed:
                    c.never_failed += 1
                    t.note(f"claims: a job exiting {code} by itself never failed ({j['state']})")
                    d.cancel(jid)
        finally:
            B.stop_and_count(d, t)


def summary(c: Claims) -> str:
    """The counts bench_faults' last line adds."""
    return (f"{c.curve_lies} curve lies, {c.taken} nodes taken, {c.inflations} key inflations, "
            f"{c.stalls} daemon stalls, {c.loops} stop-code loops, {c.never_failed} never failed")
