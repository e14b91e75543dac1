"""A local user's attacks on the daemon's privileges and descriptors, for ``benchmarks/attacks/bench_faults.py``
(part ``round2``, the second set of attacks written).

Against a real root daemon (toy runtime, local backend), as another local user
(``nobody``, through ``setpriv``):

* **privilege probes** (P; escaped: PA): a job that prints its environment (a
  variable set only for the daemon must not reach it); a job whose ``cwd`` is an open
  folder inside root's 0700 home, directly and through a link swapped after
  submission (it must not list it); a job that leaves a ``setsid()`` grandchild (it must end with the job's
  cancel); a job row without an owner (the old schema: it must not run as root); a
  job that floods its log (the log must stay under its cap); and two **cgroup escape
  probes** (:func:`cgroup_escapes`): a job that writes itself into every cgroup above its own
  (it must stay in its worker's cgroup), and a ``setsid()`` grandchild whose agent and
  worker are killed -9 (it must end once the daemon's next agent starts on this machine:
  the subreaper alone cannot catch it).
* **spoofed reports** (added to S; accepted: A): a job signs reports for itself
  (it holds its secret) claiming 2^31-1 samples each; accepted if its progress grows
  past what its node could train. Then, once it has a measured rate, 1,000 times its
  own rate (under the absolute bound): accepted if its progress grows past 4x its rate.
* **descriptor floods** (D; daemon down: DD): ~1,000 idle connections each to the
  monitor port, the agent port and the control socket, held at once, against a
  daemon started with the usual 1,024-descriptor limit; down (one count each) if
  the daemon died, did not answer a ``ping`` on its control socket, or did not
  start a job submitted during the flood (a new worker, a new monitor connection).
* **store attacks** (R; accepted: RA): the rendezvous store's attacks; :func:`store_attacks` calls
  them (``benchmarks/attacks/store_faults.py``, ``attacks(state_dir) -> (tried, accepted)``) when it
  exists, else counts 0 tried.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faults_common as B

FLOODS = 1000
"""Connections one user opens to each port in a descriptor flood."""
DAEMON_ONLY = "MT_DAEMON_ONLY_SECRET"
NOFILE_START = 1024
"""The daemon is started with this open-file limit (the usual default), as in the issue's report."""

CONFIG = """
state_dir = "{state}"
runtime = "toy"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 6.0
backend = "local"
[local]
nodes = 3
trace = "none"
"""

SH_JOB = """
name = "{name}"
command = ["/bin/sh", "-c", {script}]
min_nodes = 1
max_nodes = 1
"""

GRANDCHILD = "setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 300"

HOLD = (
    "import socket, sys, time\n"
    "kind, where, n, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])\n"
    "held = []\n"
    "for _ in range(n):\n"
    "    try:\n"
    "        if kind == 'unix':\n"
    "            s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(where)\n"
    "        else:\n"
    "            host, port = where.rsplit(':', 1); s = socket.create_connection((host, int(port)), timeout=2)\n"
    "        held.append(s)\n"
    "    except OSError:\n"
    "        pass\n"
    "print(len(held), flush=True)\n"
    "time.sleep(hold)\n"
)


@dataclass
class Round2:
    probes: int = 0
    escaped: int = 0
    store_tried: int = 0
    store_accepted: int = 0
    floods: int = 0
    down: int = 0


def store_attacks(state: Path) -> tuple[int, int]:
    """(tried, accepted) of the rendezvous store's attacks: ``benchmarks/attacks/store_faults.py``
    ``attacks(state_dir)`` when it exists; until then (0, 0)."""
    try:
        mod = importlib.import_module("store_faults")
    except ImportError:
        print("  store attacks: not tried here (benchmarks/attacks/store_faults.py is not in this tree)")
        return 0, 0
    tried, accepted = mod.attacks(state)
    return int(tried), int(accepted)


def _submit_as_nobody(d: B.Daemon, name: str, script: str) -> str:
    f = d.top / f"{name}.toml"
    f.write_text(SH_JOB.format(name=name, script=json.dumps(script)))
    os.chmod(f, 0o644)
    res = B.cli("submit", str(f), "--state-dir", str(d.state), as_nobody=True)
    if res.returncode != 0:
        raise RuntimeError(f"submit {name} as nobody failed: {res.stderr[-500:]}")
    return res.stdout.strip()


def _ask_as_nobody(state: Path, req: dict[str, Any]) -> dict[str, Any] | None:
    code = ("import json,sys; from pathlib import Path; from malletrain.daemon.control import ask; "
            "print(json.dumps(ask(Path(sys.argv[1]), json.loads(sys.argv[2]))))")
    res = subprocess.run(["setpriv", f"--reuid={B.NOBODY}", f"--regid={B.NOBODY}", "--clear-groups", B.PY, "-c",
                          code, str(state), json.dumps(req)], capture_output=True, text=True, timeout=60, cwd="/")
    return json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else None


def _log_of(d: B.Daemon, jid: str) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((d.state / "logs").glob(f"{jid}.*.log*")))


def _ended(d: B.Daemon, jid: str) -> bool:
    return d.jobs()[jid]["state"] in ("failed", "cancelled", "completed")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def probes(t: B.Tally, r: Round2, d: B.Daemon) -> None:
    """The privilege probes and the self-signed reports (P, PA; S, A)."""
    top = d.top
    home = top / "root-home"  # root's 0700 home, with a project folder that is open inside it
    home.mkdir(mode=0o700)
    private = home / "project"
    private.mkdir(mode=0o755)
    (private / "root-secret-file").write_text("x")
    # the environment
    jid = _submit_as_nobody(d, "env", "env; sleep 60")
    B.wait(lambda: "PATH=" in _log_of(d, jid), 60)
    r.probes += 1
    if DAEMON_ONLY in _log_of(d, jid):
        r.escaped += 1
        t.note(f"round2: the daemon's {DAEMON_ONLY} reached another user's job")
    d.cancel(jid)
    # cwd: root's 0700 dir, directly and through a link swapped after the check
    public = top / "public"
    public.mkdir(mode=0o755)
    link = top / "link"
    link.symlink_to(public)
    for name, cwd in (("cwd-direct", str(private)), ("cwd-swapped", str(link))):
        reply = _ask_as_nobody(d.state, {"cmd": "submit", "spec": {"name": name, "command": ["/bin/ls", "-a", "."],
                                                                    "cwd": cwd}})
        r.probes += 1
        if name == "cwd-swapped":
            link.unlink()
            link.symlink_to(private)
        if not reply or not reply.get("ok"):
            continue  # refused at submit: nothing ran
        B.wait(lambda: _ended(d, reply["id"]) or "root-secret-file" in _log_of(d, reply["id"]), 60)
        if "root-secret-file" in _log_of(d, reply["id"]):
            r.escaped += 1
            t.note(f"round2: a job listed root's 0700 directory through its cwd ({name})")
        d.cancel(reply["id"])
    # a setsid() grandchild must end with its job
    pidfile = top / "grandchild.pid"
    os.chmod(top, 0o777)  # nobody writes the pid file
    jid = _submit_as_nobody(d, "escape", GRANDCHILD.format(pidfile=pidfile))
    B.wait(lambda: pidfile.exists() and pidfile.read_text().strip().isdigit(), 60)
    os.chmod(top, 0o755)
    r.probes += 1
    if pidfile.exists() and pidfile.read_text().strip().isdigit():
        pid = int(pidfile.read_text())
        d.cancel(jid)
        B.wait(lambda: _ended(d, jid), 30)
        if B.wait(lambda: not _alive(pid), 15) is None:
            r.escaped += 1
            t.note(f"round2: a setsid() grandchild (pid {pid}) outlived its cancelled job")
            os.kill(pid, signal.SIGKILL)
    else:
        t.note("round2: the grandchild probe never started")
    # a job that floods its log
    jid = _submit_as_nobody(d, "logflood", "head -c 150000000 /dev/zero | tr '\\0' x; sleep 60")
    B.wait(lambda: sum(p.stat().st_size for p in (d.state / "logs").glob(f"{jid}.*.log*")) > 1e6, 60)
    time.sleep(5.0)
    r.probes += 1
    size = sum(p.stat().st_size for p in (d.state / "logs").glob(f"{jid}.*.log*"))
    if size > 2 * 64 * 2**20 + 2**20:
        r.escaped += 1
        t.note(f"round2: a job's logs grew to {size} bytes (cap 2 x 64 MiB)")
    print(f"  log flood: 150 MB written, {size / 2**20:.1f} MiB kept", flush=True)
    d.cancel(jid)
    self_signed_reports(t, d)


CGROUP_MOVE = ("for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/unified/cgroup.procs "
               "/sys/fs/cgroup/freezer/cgroup.procs /sys/fs/cgroup/pids/cgroup.procs; do "
               "[ -e $f ] && (echo $$ > $f) 2>/dev/null && echo moved-via-$f; done; "
               "echo probe-done; cat /proc/$$/cgroup; sleep 60")


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(") ", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_escapes(t: B.Tally, r: Round2, d: B.Daemon) -> None:
    """A job leaving its cgroup; a grandchild outliving an agent killed -9 (P, PA)."""
    used = sorted({line.split("containment: ", 1)[1].split(" (")[0] for p in (d.state / "logs").glob("agent-*.log")
                   for line in p.read_text(errors="replace").splitlines() if "containment: " in line})
    print(f"  agents' containment: {'; '.join(used) or 'not logged'}", flush=True)
    jid = _submit_as_nobody(d, "cgroup-move", CGROUP_MOVE)
    B.wait(lambda: "probe-done" in _log_of(d, jid) or _ended(d, jid), 60)
    r.probes += 1
    if "moved-via-" in _log_of(d, jid):
        r.escaped += 1
        t.note(f"round2: a job wrote itself out of its cgroup: {_log_of(d, jid).split('probe-done')[0].strip()}")
    d.cancel(jid)
    pidfile = d.top / "orphan.pid"
    os.chmod(d.top, 0o777)
    jid = _submit_as_nobody(d, "agent-killed", GRANDCHILD.format(pidfile=pidfile))
    B.wait(lambda: pidfile.exists() and pidfile.read_text().strip().isdigit(), 60)
    os.chmod(d.top, 0o755)
    r.probes += 1
    if not (pidfile.exists() and pidfile.read_text().strip().isdigit()):
        t.note("round2: the agent-killed probe never started")
        return
    pid = int(pidfile.read_text())
    worker = _parent(pid)
    agent = _parent(worker) if worker else None
    for victim in (agent, worker):  # the agent first: nothing of it cleans up
        if victim:
            os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    if B.wait(lambda: not _alive(pid), 90) is None:
        r.escaped += 1
        t.note(f"round2: a setsid() grandchild (pid {pid}) outlived its agent and worker killed -9")
        os.kill(pid, signal.SIGKILL)
    else:
        print(f"  agent killed -9: its job's setsid() grandchild ended {time.monotonic() - t0:.1f} s later "
              f"(the next agent found it by its cgroup)", flush=True)
    d.cancel(jid)


def self_signed_reports(t: B.Tally, d: B.Daemon) -> None:
    """A job holds its own secret: it signs reports claiming 2^31-1 samples (S, A)."""
    import zmq

    from contract.messages import MAX_SAMPLES, Report, job_secret, secret_key
    from malletrain.daemon.monitor import MAX_RATE_PER_NODE
    from malletrain.daemon.ratebound import HistoryBound

    jid = d.submit(B.TOY_JOB.format(name="greedy", rate=200, lo=1, hi=1, profile="false", samples=""), "greedy")
    B.wait(lambda: d.jobs()[jid]["samples"] > 0, 60)
    key = secret_key(job_secret((d.state / "monitor.key").read_bytes(), jid))
    info = json.loads((d.state / "daemon.json").read_text())
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(info["monitor"])
    before, t0 = d.jobs()[jid]["samples"], time.time()
    for seq in range(10):
        push.send(Report(jid, 10**12 + seq, MAX_SAMPLES, time.time(), 1, 10**6, "greedy").encode(key))
        t.spoofed += 1
        time.sleep(0.2)
    time.sleep(3.0)
    gained, spent = d.jobs()[jid]["samples"] - before, time.time() - t0
    if gained > MAX_RATE_PER_NODE * (spent + 600):
        t.accepted += 1
        t.note(f"round2: a job's self-signed reports added {gained} samples in {spent:.0f} s")
    # once it has a history (20 reports over 60 s), 1,000x its own rate: under the absolute bound, over the relative
    B.wait(lambda: time.time() - t0 > HistoryBound().min_seconds + 15, 120, step=1.0)
    h0, s0 = time.time(), d.jobs()[jid]["samples"]
    time.sleep(10.0)
    honest = (d.jobs()[jid]["samples"] - s0) / (time.time() - h0)
    before, t0 = d.jobs()[jid]["samples"], time.time()
    for seq in range(10):
        push.send(Report(jid, 10**12 + 100 + seq, int(1000 * honest), time.time(), 1, 10**6, "greedy").encode(key))
        t.spoofed += 1
        time.sleep(1.0)
    time.sleep(3.0)
    gained, spent = d.jobs()[jid]["samples"] - before, time.time() - t0
    bound = honest * spent + HistoryBound().factor * honest * (spent + HistoryBound().bank_s)
    print(f"  1,000x its own rate ({honest:.0f}/s): {gained} samples taken in {spent:.0f} s (bound {bound:.0f})",
          flush=True)
    if honest <= 0 or gained > bound:
        t.accepted += 1
        t.note(f"round2: claims at 1,000x a job's own rate added {gained} samples in {spent:.0f} s")
    push.close()
    d.cancel(jid)


def floods(t: B.Tally, r: Round2, d: B.Daemon) -> None:
    """~1,000 idle connections from one user to each port at once (D, DD): the daemon must stay up,
    answer a ping on its control socket (not the store's fallback) and start a new job that reports."""
    from malletrain.daemon.control import request, socket_path

    info = json.loads((d.state / "daemon.json").read_text())
    targets = (("tcp", info["monitor"].split("//", 1)[1]), ("tcp", info["agents"].split("//", 1)[1]),
               ("unix", str(socket_path(d.state))))
    holds = [subprocess.Popen(["setpriv", f"--reuid={B.NOBODY}", f"--regid={B.NOBODY}", "--clear-groups", B.PY,
                               "-c", HOLD, kind, where, str(FLOODS), "40"], stdout=subprocess.PIPE, text=True,
                              cwd="/") for kind, where in targets]
    r.floods += len(holds)
    time.sleep(8.0)
    alive = d.alive()
    pong = request(socket_path(d.state), {"cmd": "ping"}, 10.0) if alive else None
    jid = d.submit(B.TOY_JOB.format(name="during-flood", rate=200, lo=1, hi=1, profile="false", samples=""),
                   "during-flood")
    trains = alive and B.wait(lambda: d.jobs()[jid]["samples"] > 0, 25) is not None
    for h in holds:
        h.kill()
    opened = [(h.communicate(timeout=30)[0].strip() or "?") for h in holds]
    print(f"  floods of {', '.join(opened)} connections (monitor, agents, control): daemon "
          f"{'up' if alive else 'DEAD'}, ping {'answered' if pong and pong.get('ok') else 'NOT answered'}, "
          f"a job submitted meanwhile {'trains' if trains else 'does NOT train'}", flush=True)
    for what, ok in (("died", alive), ("stopped answering its control socket", bool(pong and pong.get("ok"))),
                     ("started no new job", trains)):
        if not ok:
            r.down += 1
            t.note(f"round2: under the descriptor floods the daemon {what}")
    d.cancel(jid)


def ownerless(t: B.Tally, r: Round2, d: B.Daemon) -> None:
    """A job row without an owner (old schema) must not run as root."""
    marker = d.top / "ownerless.uid"
    jid = _submit_as_nobody(d, "ownerless", f"id -u > {marker}.$$; sleep 60")
    d.stop()
    with sqlite3.connect(str(d.state / "store.db")) as conn:
        conn.execute("UPDATE jobs SET owner_uid = NULL, owner_gid = NULL, state = 'pending' WHERE id = ?", (jid,))
    os.chmod(d.top, 0o777)
    d.start()
    B.wait(lambda: _ended(d, jid) or list(d.top.glob("ownerless.uid.*")), 30)
    time.sleep(2.0)
    os.chmod(d.top, 0o755)
    r.probes += 1
    uids = [p.read_text().strip() for p in d.top.glob("ownerless.uid.*")]
    if "0" in uids:
        r.escaped += 1
        t.note("round2: a job without an owner ran as root")
    print(f"  ownerless job: {d.jobs()[jid]['state']} ({d.jobs()[jid]['message'][:80]})", flush=True)


def part_round2(t: B.Tally, r: Round2) -> None:
    print("round2: another user's jobs probing the privilege drop; self-signed reports; descriptor floods; "
          "the rendezvous store", flush=True)
    if os.geteuid() != 0:
        t.note("round2: not root: the other-user probes were not tried")
        return
    with B.workdir("mt-faults-round2-") as top:
        os.environ[DAEMON_ONLY] = "hunter2"  # set only for the daemon (and this bench)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(NOFILE_START, hard), hard))  # the usual default
        try:
            d = B.Daemon(top, CONFIG)
            d.start()
        finally:
            del os.environ[DAEMON_ONLY]
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        try:
            probes(t, r, d)
            cgroup_escapes(t, r, d)
            floods(t, r, d)
            tried, accepted = store_attacks(d.state)
            r.store_tried += tried
            r.store_accepted += accepted
            ownerless(t, r, d)
        finally:
            if not d.alive():
                r.down += 1
                t.note("round2: the daemon died")
            B.stop_and_count(d, t)


def summary(r: Round2) -> str:
    """The counts bench_faults' last line adds."""
    return (f"{r.store_tried} store attacks, {r.store_accepted} accepted, {r.probes} privilege probes, "
            f"{r.escaped} escaped, {r.floods} fd floods, {r.down} daemon down")

