"""Crashes, recalls, fuzz and forgeries against real daemons; prints a table and one summary line.

    python benchmarks/bench_faults.py [--kills 20] [--recalls 100] [--fuzz 3000] [--seed 1]

Every part runs the real thing (``malletrain daemon`` subprocesses, local backend,
real agents and workers) on a private state dir, and counts what issue E asks:

* **kills**: a toy-runtime daemon on 4 nodes whose idleness flips (a written
  nodes-csv trace), a mix of jobs (with targets, without, profiled), submits and
  cancels through the CLI before and after each of ``--kills`` random
  ``kill -9``s, some while the daemon is down. Lost: a submitted job missing from
  the store, or one neither cancelled nor completed at the end. Duplicated: a job
  id or name twice in the store, or two live workers of one job on one node.
  Progress going backwards between two looks is counted as lost too.
* **restarts** of every job kind with real PyTorch workers: running (its workers
  adopted after ``kill -9``, fresh workers after a clean stop), profiling, queued,
  and suspended when the trace's recall catches the job on its node (the states
  before each restart are printed; ``tests/test_restarts.py`` makes the suspended
  case deterministic); each restarted after SIGTERM and after ``kill -9``. Lost: a
  job that does not train again after its restarts.
* **recalls**: ``--recalls`` node recalls from a trace during real PyTorch
  training of two elastic jobs. Lost: a job that fails or stops training.
* **fuzz**: ``--fuzz`` mutated inputs per kind (trace files of each format, job
  files, daemon configs, monitor frames, control requests to a live daemon).
  Tracebacks: any exception but the input's own error type, a hang (5 s), a
  traceback in a daemon or agent log, or a daemon that stops answering.
* **spoofing**: forged reports (unsigned, wrong key, another job's key, replayed,
  oversize values, unknown job), control requests from another local user
  (cancel of someone else's job, shutdown, a submit claiming another owner).
  Accepted: any of them that changed anything.

Orphans: processes that mention a state dir after its daemon stopped.
Goals: lost = duplicated = orphans = tracebacks = accepted = 0. The last line is
``faults: K kills, L lost, D duplicated, R recalls, O orphans, F fuzz cases, T tracebacks,
S spoofed reports, A accepted``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil

from malletrain.procs import procs_mentioning

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
NOBODY = 65534


# ---------------------------------------------------------------- tallies
@dataclass
class Tally:
    kills: int = 0
    lost: int = 0
    duplicated: int = 0
    recalls: int = 0
    orphans: int = 0
    fuzz: int = 0
    tracebacks: int = 0
    spoofed: int = 0
    accepted: int = 0
    notes: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.notes.append(what)
        print(f"  ! {what}", flush=True)


# ---------------------------------------------------------------- helpers
def cli(*args: str, timeout: float = 60, as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [PY, "-m", "malletrain", *args]
    if as_nobody:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


def wait(pred: Callable[[], Any], timeout: float, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    return None


class Daemon:
    """One ``malletrain daemon`` subprocess on ``state`` with ``config`` (TOML text)."""

    def __init__(self, top: Path, config: str) -> None:
        self.top = top
        self.state = top / "state"
        self.cfg = top / "daemon.toml"
        self.cfg.write_text(config.format(state=self.state))
        self.log = top / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        (self.state / "daemon.json").unlink(missing_ok=True)
        self.proc = subprocess.Popen([PY, "-m", "malletrain", "daemon", "--config", str(self.cfg)],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd="/")
        if not wait(lambda: (self.state / "daemon.json").exists() or self.proc.poll() is not None, 60):
            raise RuntimeError(f"daemon did not start; see {self.log}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log.read_text()[-1500:]}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any]:
        res = cli("status", "--json", "--state-dir", str(self.state))
        if res.returncode != 0:
            raise RuntimeError(f"status failed: {res.stderr[-500:]}")
        return json.loads(res.stdout)

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {j["id"]: j for j in self.status()["jobs"]}

    def submit(self, text: str, name: str) -> str:
        f = self.top / f"{name}.toml"
        f.write_text(text)
        os.chmod(f, 0o644)
        res = cli("submit", str(f), "--state-dir", str(self.state))
        if res.returncode != 0:
            raise RuntimeError(f"submit {name} failed: {res.stderr[-500:]}")
        return res.stdout.strip()

    def cancel(self, jid: str) -> None:
        cli("cancel", jid, "--state-dir", str(self.state))

    def log_tracebacks(self) -> int:
        """Tracebacks the daemon or the agents wrote (workers' own logs are the user's business)."""
        files = [self.log, *sorted((self.state / "logs").glob("agent-*.log"))]
        return sum(p.read_text(errors="replace").count("Traceback (most recent call last)") for p in files
                   if p.exists())

    def orphans(self) -> int:
        left = wait(lambda: not procs_mentioning(str(self.state)), 20)
        procs = [] if left else procs_mentioning(str(self.state))
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        return len(procs)


@contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(top, 0o755)  # another local user must reach the control socket (spoofing part)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def flip_trace(path: Path, nodes: int, changes: int, span_s: float, rng: random.Random,
               min_idle: int = 1) -> int:
    """A nodes-csv trace: all ``nodes`` idle, then ``changes`` state flips over ``span_s`` seconds,
    never fewer than ``min_idle`` idle; returns the number of recalls (idle -> busy) in it."""
    t0 = 1_700_000_000
    names = [f"n{i:02d}" for i in range(nodes)]
    idle = {n: True for n in names}
    rows = [f"{t0},{n},1" for n in names]
    recalls = 0
    for k in range(changes):
        t = t0 + 1 + int((k + 1) * span_s / changes)
        busy_ok = [n for n in names if idle[n]] if sum(idle.values()) > min_idle else []
        back = [n for n in names if not idle[n]]
        if busy_ok and (not back or rng.random() < 0.5):
            n = rng.choice(busy_ok)
            idle[n] = False
            recalls += 1
        else:
            n = rng.choice(back)
            idle[n] = True
        rows.append(f"{t},{n},{int(idle[n])}")
    end = t0 + 2 + int(span_s)
    rows += [f"{end},{n},1" for n in names if not idle[n]]  # afterwards every node is idle again
    path.write_text("time,node,idle\n" + "\n".join(rows) + "\n")
    return recalls


# ---------------------------------------------------------------- kills
TOY_CONFIG = """
state_dir = "{{state}}"
runtime = "toy"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 4.0
backend = "local"
[local]
nodes = 4
trace = "{trace}"
time_scale = 1.0
[policy]
profiling = "requested"
"""

TOY_JOB = """
name = "{name}"
command = ["python", "-m", "malletrain.toy_runtime", "--rate", "{rate}"]
min_nodes = {lo}
max_nodes = {hi}
profile = {profile}
{samples}
"""


def part_kills(t: Tally, kills: int, rng: random.Random) -> None:
    print(f"kills: {kills} kill -9s of a toy daemon with submits and cancels around them", flush=True)
    with workdir("mt-faults-kills-") as top:
        trace = top / "trace.csv"
        flip_trace(trace, 4, 3 * kills, 4.0 * kills, rng)
        d = Daemon(top, TOY_CONFIG.format(trace=trace))
        d.start()
        submitted: dict[str, str] = {}  # id -> name
        cancelled: set[str] = set()
        seen: dict[str, int] = {}
        n = 0

        def submit_some(k: int) -> None:
            nonlocal n
            for _ in range(k):
                n += 1
                lo = rng.choice((1, 1, 2))
                text = TOY_JOB.format(name=f"job{n}", rate=rng.choice((1000, 4000)), lo=lo, hi=rng.choice((lo, 4)),
                                      profile=rng.choice(("false", "false", "true")),
                                      samples=f"samples = {rng.choice((5000, 20000, 60000))}")
                submitted[d.submit(text, f"job{n}")] = f"job{n}"

        def look() -> None:
            for jid, j in d.jobs().items():
                if j["samples"] < seen.get(jid, 0):
                    t.lost += 1
                    t.note(f"{jid}: stored progress went back from {seen[jid]} to {j['samples']}")
                seen[jid] = max(seen.get(jid, 0), j["samples"])

        submit_some(4)
        for k in range(kills):
            time.sleep(rng.uniform(0.5, 3.0))
            submit_some(rng.randint(0, 2))
            live = [j for j in submitted if j not in cancelled]
            if live and rng.random() < 0.3:
                victim = rng.choice(live)
                d.cancel(victim)
                cancelled.add(victim)
            look()
            d.kill9()
            t.kills += 1
            if rng.random() < 0.5:  # submit and cancel while the daemon is down (straight into the store)
                submit_some(1)
                if rng.random() < 0.5:
                    victim = rng.choice(list(submitted))
                    d.cancel(victim)
                    cancelled.add(victim)
            time.sleep(rng.uniform(0.0, 2.0))
            d.start()
            look()
            dup = duplicate_workers(d.state)
            if dup:
                t.duplicated += dup
                t.note(f"after kill {k + 1}: {dup} job(s) with two live workers on one node")
        done = wait(lambda: all(j["state"] in ("completed", "cancelled") for j in d.jobs().values()), 300, 1.0)
        jobs = d.jobs()
        look()
        rc = d.stop()
        t.tracebacks += d.log_tracebacks() + (rc != 0)
        t.orphans += d.orphans()
        names = [j["name"] for j in jobs.values()]
        t.duplicated += len(names) - len(set(names)) + len(set(jobs) - set(submitted))
        missing = set(submitted) - set(jobs)
        unfinished = [jid for jid, j in jobs.items() if j["state"] not in ("completed", "cancelled")]
        t.lost += len(missing) + len(unfinished)
        for jid in missing:
            t.note(f"{jid} ({submitted[jid]}) is missing from the store")
        for jid in unfinished:
            t.note(f"{jid} ended the run {jobs[jid]['state']} ({jobs[jid]['message']})")
        print(f"  {len(submitted)} jobs, {len(cancelled)} cancels, "
              f"{sum(j['state'] == 'completed' for j in jobs.values())} completed, "
              f"{'all ended' if done else 'NOT all ended'}", flush=True)


def duplicate_workers(state: Path) -> int:
    """Jobs that have two live toy workers on one node (a restart that started a second copy)."""
    count: dict[tuple[str, str], int] = {}
    for p in procs_mentioning(str(state)):
        try:
            env = p.environ()
        except psutil.Error:
            continue
        job, worker = env.get("MALLETRAIN_JOB"), env.get("MALLETRAIN_WORKER", "")
        node = worker.split(".")[1] if worker.count(".") >= 1 else None
        if job and node and "malletrain.toy_runtime" in " ".join(p.cmdline()):
            count[(job, node)] = count.get((job, node), 0) + 1
    return sum(1 for c in count.values() if c > 1)


# ---------------------------------------------------------------- restarts and recalls (PyTorch)
TORCH_CONFIG = """
state_dir = "{{state}}"
runtime = "torch"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 6.0
backend = "local"
[local]
nodes = {nodes}
trace = "{trace}"
time_scale = 1.0
[policy]
max_running = {max_running}
"""

TORCH_JOB = """
name = "{name}"
command = ["python", "-m", "malletrain.examples.train", "--model", "linear", "--samples", "1000000000",
           "--step-sleep", "0.02"]
min_nodes = {lo}
max_nodes = {hi}
profile = {profile}
env = {{ OMP_NUM_THREADS = "1" }}
"""


def trains(d: Daemon, jid: str, timeout: float) -> bool:
    """The job's stored progress grows within ``timeout``."""
    start = d.jobs()[jid]["samples"]
    return bool(wait(lambda: d.jobs()[jid]["samples"] > start, timeout, 0.5))


def part_restarts(t: Tally) -> None:
    print("restarts: every job kind through SIGTERM and kill -9 restarts, real PyTorch workers", flush=True)
    with workdir("mt-faults-restarts-") as top:
        # node n03 is recalled at +40 s and stays busy: the job on it is suspended
        trace = top / "trace.csv"
        t0 = 1_700_000_000
        rows = [f"{t0},n{i:02d},1" for i in range(4)] + [f"{t0 + 40},n03,0"]
        trace.write_text("time,node,idle\n" + "\n".join(rows) + "\n")
        d = Daemon(top, TORCH_CONFIG.format(nodes=4, trace=trace, max_running=3))
        d.start()
        kinds = {
            "running": d.submit(TORCH_JOB.format(name="running", lo=1, hi=2, profile="false"), "running"),
            "profiling": d.submit(TORCH_JOB.format(name="profiling", lo=1, hi=1, profile="true"), "profiling"),
        }
        if not wait(lambda: all(d.jobs()[j]["samples"] > 0 for j in kinds.values()), 240, 1.0):
            t.note("restarts: the first jobs never trained")
        kinds["suspended"] = d.submit(TORCH_JOB.format(name="suspended", lo=1, hi=1, profile="false"), "suspended")
        kinds["queued"] = d.submit(TORCH_JOB.format(name="queued", lo=1, hi=1, profile="false"), "queued")
        wait(lambda: d.jobs()[kinds["suspended"]]["state"] == "suspended", 120, 1.0)
        for how in ("SIGTERM", "kill -9"):
            states = {k: d.jobs()[j]["state"] for k, j in kinds.items()}
            print(f"  before {how}: {states}", flush=True)
            if how == "SIGTERM":
                t.tracebacks += d.stop() != 0
            else:
                d.kill9()
                t.kills += 1
            time.sleep(1.0)
            d.start()
            for kind in ("running", "profiling"):
                if not trains(d, kinds[kind], 240):
                    t.lost += 1
                    t.note(f"restarts: the {kind} job did not train after the {how} restart")
        # the queued job waits for Pjmax; the suspended one for its node: cancel a runner, both must go
        d.cancel(kinds["running"])
        for kind in ("suspended", "queued"):
            ok = wait(lambda k=kind: d.jobs()[kinds[k]]["samples"] > 0, 240, 1.0)
            if not ok:
                t.lost += 1
                t.note(f"restarts: the {kind} job never trained after the restarts")
        rc = d.stop()
        t.tracebacks += d.log_tracebacks() + (rc != 0)
        t.orphans += d.orphans()


def part_recalls(t: Tally, recalls: int, rng: random.Random) -> None:
    print(f"recalls: {recalls} node recalls during real PyTorch training of two elastic jobs", flush=True)
    with workdir("mt-faults-recalls-") as top:
        trace = top / "trace.csv"
        span = 2.5 * recalls
        made = flip_trace(trace, 4, 2 * recalls, span, rng, min_idle=1)
        d = Daemon(top, TORCH_CONFIG.format(nodes=4, trace=trace, max_running=2))
        d.start()
        jobs = [d.submit(TORCH_JOB.format(name=f"elastic{i}", lo=1, hi=4, profile="false"), f"elastic{i}")
                for i in range(2)]
        time.sleep(span + 5)
        t.recalls += made
        for jid in jobs:
            j = d.jobs()[jid]
            if j["state"] in ("failed", "cancelled", "completed"):
                t.lost += 1
                t.note(f"recalls: {jid} ended {j['state']}: {j['message']}")
            elif not trains(d, jid, 120):
                t.lost += 1
                t.note(f"recalls: {jid} does not train after the recalls ({j['state']})")
        print(f"  samples: {[d.jobs()[j]['samples'] for j in jobs]}", flush=True)
        rc = d.stop()
        t.tracebacks += d.log_tracebacks() + (rc != 0)
        t.orphans += d.orphans()


# ---------------------------------------------------------------- fuzz
HOSTILE = [b"nan", b"inf", b"-1", b"1e999", b"1_000", "１２".encode(), b"\x00", b"\xff\xfe", b"[" * 50,
           b"9" * 400, b'"', b"\n", b"\r\n", b"x" * 5000, b"-9223372036854775809", b"{", b"}", b"=", b","]


def mutate(seed: bytes, rng: random.Random) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[pos:pos] = rng.choice(HOSTILE)
        elif op == 2:
            del data[pos:pos + rng.randint(1, 20)]
        elif op == 3:
            data = data[:pos]
        else:
            chunk = bytes(data[pos:pos + rng.randint(1, 40)])
            data[pos:pos] = chunk * rng.randint(1, 50)
    return bytes(data)


class Hang(Exception):
    pass


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def on_alarm(signum: int, frame: object) -> None:
        raise Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def fuzz_cases(t: Tally, kind: str, seeds: list[bytes], n: int, rng: random.Random,
               run: Callable[[bytes], None], allowed: tuple[type[BaseException], ...]) -> None:
    bad = 0
    for _ in range(n):
        data = mutate(rng.choice(seeds), rng)
        t.fuzz += 1
        try:
            with deadline(5.0):
                run(data)
        except allowed:
            pass
        except Hang:
            bad += 1
            t.note(f"fuzz {kind}: hang on {data[:80]!r}")
        except Exception as exc:  # noqa: BLE001 - what is counted
            bad += 1
            if bad <= 3:
                t.note(f"fuzz {kind}: {type(exc).__name__}: {str(exc)[:120]} on {data[:80]!r}")
    t.tracebacks += bad
    print(f"  {kind}: {n} cases, {bad} tracebacks or hangs", flush=True)


def part_fuzz(t: Tally, n: int, rng: random.Random) -> None:
    print(f"fuzz: {n} mutated inputs per kind", flush=True)
    import traces
    from malletrain.config import ConfigError, load_config
    from malletrain.jobspec import JobSpecError, load_spec
    from malletrain.messages import Report, new_secret, secret_key
    from malletrain.monitor import Monitor

    with workdir("mt-faults-fuzz-") as top:
        def as_file(name: str, gz: bool = False) -> Callable[[bytes], Path]:
            def write(data: bytes) -> Path:
                p = top / name
                p.write_bytes(gzip.compress(data) if gz else data)
                return p
            return write

        data_dir = ROOT.parent / "shared" / "data"
        seeds = {
            "nodes-csv": [b"time,node,idle\n100,a,1\n100,b,0\n160,a,0\n200,b,1\n"],
            "swf": [b"; MaxNodes: 4\n; MaxProcs: 4\n1 0 0 100 2 -1 -1 2 100 -1 1 1 1 -1 1 -1 -1 -1\n"
                    b"2 10 5 50 4 -1 -1 4 60 -1 1 1 1 -1 1 -1 -1 -1\n"],
            "sacct": [b"JobID|Start|End|NNodes|NodeList|State\n1|2024-01-01T00:00:00|2024-01-01T01:00:00|2|"
                      b"n[1-2]|COMPLETED\n2|2024-01-01T00:30:00|2024-01-01T02:00:00|1|n3|COMPLETED\n"],
        }
        if (data_dir / "summit-2021-02-10_17.nodes.csv.gz").exists():
            with gzip.open(data_dir / "summit-2021-02-10_17.nodes.csv.gz", "rb") as f:
                seeds["nodes-csv"].append(f.read(4000).rsplit(b"\n", 1)[0] + b"\n")
        for fmt, s in seeds.items():
            write = as_file(f"trace.{fmt}")
            fuzz_cases(t, f"trace {fmt}", s, n // len(seeds), rng,
                       lambda b, w=write, f=fmt: traces.read(w(b), f, nodes=None if f != "sacct" else 8),
                       (traces.TraceError,))

        job_seed = TOY_JOB.format(name="a", rate=100, lo=1, hi=2, profile="false", samples="samples = 10").encode()
        write_job = as_file("job.toml")
        fuzz_cases(t, "job file", [job_seed, b'{"name": "a", "command": ["python", "x"], "max_nodes": 2}'], n, rng,
                   lambda b: load_spec(write_job(b)), (JobSpecError, FileNotFoundError))

        cfg_seed = TOY_CONFIG.format(trace="none").replace("{state}", str(top / "s")).encode()
        write_cfg = as_file("daemon.toml")
        fuzz_cases(t, "daemon config", [cfg_seed], n, rng, lambda b: load_config(write_cfg(b)), (ConfigError,))

        secret = new_secret()
        key = secret_key(secret)
        mon = Monitor()
        mon.register("j000001", secret)
        frame_seeds = [Report("j000001", seq, 64, 1.7e9 + seq, 2, 1, "w").encode(key) for seq in range(1, 4)]
        before = mon.counts()

        def ingest(b: bytes) -> None:
            mon.ingest_batch([b])

        fuzz_cases(t, "monitor frame", frame_seeds, n, rng, ingest, ())
        internal = mon.counts().get("internal", 0) - before.get("internal", 0)
        t.tracebacks += internal
        mon.close()

        d = Daemon(top, TOY_CONFIG.format(trace="none"))
        d.start()
        sock_path = d.state / "control" / "control.sock"
        req_seeds = [json.dumps(r).encode() for r in (
            {"cmd": "status"}, {"cmd": "cancel", "id": "j000001"},
            {"cmd": "submit", "spec": {"name": "a", "command": ["python", "-c", "pass"]}})]

        def control(b: bytes) -> None:
            raw_request(sock_path, b, length=rng.choice((None, None, 0, 10**9, len(b) + 5)))

        fuzz_cases(t, "control request", req_seeds, n, rng, control, (OSError,))
        if cli("status", "--state-dir", str(d.state)).returncode != 0 or not d.alive():
            t.tracebacks += 1
            t.note("fuzz: the daemon stopped answering after the control fuzz")
        for jid, j in d.jobs().items():  # fuzzed submits that got through were valid jobs: cancel them
            d.cancel(jid)
        rc = d.stop()
        t.tracebacks += d.log_tracebacks() + (rc != 0)
        t.orphans += d.orphans()


def raw_request(path: Path, body: bytes, length: int | None = None) -> bytes:
    """Send one framed request (any bytes, any claimed length) and read whatever comes back."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(6.0)
    try:
        s.connect(str(path))
        s.sendall(struct.pack(">I", len(body) if length is None else length % 2**32) + body)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out
    finally:
        s.close()


# ---------------------------------------------------------------- spoofing
def signed_raw(obj: dict[str, Any], key: bytes) -> bytes:
    """A frame signed with ``key`` whatever its payload holds (NaN included): what a job's own
    worker could send, so the monitor's checks, not the encoder's, must stop it."""
    from malletrain.messages import sign

    body = json.dumps(obj, separators=(",", ":")).encode()
    return body[:-1] + b',"sig":"' + sign(body[:-1], key) + b'"}'


def part_spoof(t: Tally) -> None:
    print("spoofing: forged and replayed reports; another user's control requests", flush=True)
    import zmq

    from malletrain.messages import Report, new_secret, secret_key
    from malletrain.monitor import job_secret

    with workdir("mt-faults-spoof-") as top:
        d = Daemon(top, TOY_CONFIG.format(trace="none"))
        d.start()
        victim = d.submit(TOY_JOB.format(name="victim", rate=200, lo=1, hi=1, profile="false", samples=""), "victim")
        other = d.submit(TOY_JOB.format(name="other", rate=200, lo=1, hi=1, profile="false", samples=""), "other")
        wait(lambda: all(d.jobs()[j]["samples"] > 0 for j in (victim, other)), 60)
        info = json.loads((d.state / "daemon.json").read_text())
        master = (d.state / "monitor.key").read_bytes()  # the bench runs as the daemon's user
        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 2000)
        push.connect(info["monitor"])
        now = time.time()
        big = 10**12
        own_key = secret_key(job_secret(master, victim))
        legit = Report(victim, 1, big, now, 1, 99, "bench").encode(own_key)
        forged = {
            "unsigned": Report(victim, 1, big, now, 1, 99, "x").encode(None),
            "wrong key": Report(victim, 1, big, now, 1, 99, "x").encode(secret_key(new_secret())),
            "another job's key": Report(victim, 1, big, now, 1, 99, "x").encode(
                secret_key(job_secret(master, other))),
            "unknown job": Report("j999999", 1, big, now, 1, 99, "x").encode(secret_key(new_secret())),
            "samples 10^400": legit.replace(str(big).encode(), b"1" + b"0" * 400, 1),
            "NaN time": signed_raw({"v": 2, "type": "report", "job": victim, "seq": 2, "payload": {
                "samples": big, "timestamp": float("nan"), "world_size": 1, "generation": 99, "worker": "y"}},
                own_key),
            "generation 'abc'": signed_raw({"v": 2, "type": "report", "job": victim, "seq": 3, "payload": {
                "samples": big, "timestamp": now, "world_size": 1, "generation": "abc", "worker": "z"}},
                own_key),
        }
        before = d.jobs()[victim]["samples"]
        probe = Report(victim, 1, 1, now, 1, 99, "probe").encode(own_key)  # genuine: proves frames arrive
        push.send(probe)
        if not wait(lambda: d.jobs()[victim]["samples"] > before, 15):
            t.lost += 1
            t.note("spoof: a genuine report was never counted, so the forgery checks prove nothing")
        before = d.jobs()[victim]["samples"]
        for name, frame in forged.items():
            push.send(frame)
            t.spoofed += 1
        time.sleep(3.0)
        after = d.jobs()[victim]
        if after["samples"] - before >= big or after["state"] != "running":
            t.accepted += 1
            t.note(f"spoof: a forged report changed {victim}: {before} -> {after['samples']}, {after['state']}")
        # replay: one genuine frame (as if sniffed on the wire) counts once, never twice
        push.send(legit)
        wait(lambda: d.jobs()[victim]["samples"] >= before + big, 10)
        once = d.jobs()[victim]["samples"]
        for _ in range(3):
            push.send(legit)
            t.spoofed += 1
        time.sleep(3.0)
        if d.jobs()[victim]["samples"] >= once + big:
            t.accepted += 1
            t.note("spoof: a replayed report was counted again")
        push.close()

        # another local user: cancel root's job, shut the daemon down, submit as someone else
        if os.geteuid() == 0 and shutil.which("setpriv"):
            res = cli("cancel", victim, "--state-dir", str(d.state), as_nobody=True)
            t.spoofed += 1
            if res.returncode == 0 or d.jobs()[victim]["state"] == "cancelled":
                t.accepted += 1
                t.note(f"spoof: another user cancelled {victim}")
            code = ("import json,sys; from pathlib import Path; from malletrain.control import ask; "
                    "s=Path(sys.argv[1]); print(json.dumps([ask(s, {'cmd': 'shutdown'}), "
                    "ask(s, {'cmd': 'submit', 'spec': {'name': 'x', 'command': ['id']}, 'owner_uid': 0})]))")
            res = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                  PY, "-c", code, str(d.state)], capture_output=True, text=True, timeout=60, cwd="/")
            t.spoofed += 2
            replies = json.loads(res.stdout) if res.returncode == 0 else [None, None]
            time.sleep(1.0)
            if not d.alive():
                t.accepted += 1
                t.note("spoof: another user shut the daemon down")
            if any(j["owner_uid"] == 0 and j["name"] == "x" for j in d.jobs().values()):
                t.accepted += 1
                t.note("spoof: another user submitted a job owned by root")
            if replies[0] and replies[0].get("ok"):
                t.accepted += 1
                t.note(f"spoof: shutdown answered ok for another user: {replies[0]}")
        else:
            t.note("spoof: not root (or no setpriv): the other-user requests were not tried")
        hijack_agents(t, d, top)
        if not trains(d, victim, 90):
            t.lost += 1
            t.note(f"spoof: {victim} did not train again after the hijack and the daemon's return")
        rc = d.stop()
        t.tracebacks += d.log_tracebacks() + (rc != 0)
        t.orphans += d.orphans()


def hijack_agents(t: Tally, d: Daemon, top: Path) -> None:
    """The daemon dies; a local user binds its agent port first, without the key, and sends every
    command it can make. Accepted: a command an agent ran. Then the real daemon comes back."""
    import secrets

    import zmq

    from scavenger import channel as C
    from scavenger import protocol as P

    address = json.loads((d.state / "daemon.json").read_text())["agents"]
    d.kill9()
    t.kills += 1
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    wrong = secrets.token_bytes(32)
    markers = top / "hijack"
    markers.mkdir()
    nonces: dict[bytes, tuple[bytes, bytes]] = {}
    deadline = time.monotonic() + 8.0
    sent = 0
    while time.monotonic() < deadline:
        if sock.poll(100):
            ident, frame = sock.recv_multipart()
            node = ident.decode(errors="replace")
            kind = C.kind_of(frame)
            if kind is C.Kind.CHALLENGE:
                nonces[ident] = (C.parse_challenge(frame), C.new_nonce())
                sock.send_multipart([ident, C.nonce_frame(nonces[ident][1])])
            elif kind is C.Kind.FINISH and ident in nonces:
                sock.send_multipart([ident, C.proof_frame(C.hub_proof(wrong, node, *nonces[ident]))])
                session = C.Session.for_hub(C.session_key(wrong, node, *nonces[ident]))
                argv = ("/bin/sh", "-c", f"touch {markers}/{node}-{sent}")
                for frame_out in (session.seal(P.encode(P.StartWorker(node, f"evil{sent}", argv))),
                                  P.encode(P.StartWorker(node, f"raw{sent}", argv)),
                                  P.encode(P.Shutdown(node))):
                    sock.send_multipart([ident, frame_out])
                    sent += 1
    sock.close(0)
    ctx.term()
    t.spoofed += sent
    ran = list(markers.iterdir())
    if ran:
        t.accepted += len(ran)
        t.note(f"spoof: agents ran {len(ran)} command(s) of a hijacker on the agent port")
    if sent == 0:
        t.note("spoof: no agent reached the hijacker (nothing tried)")
    d.start()  # the real daemon is back: its agents prove themselves to it again


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--recalls", type=int, default=100)
    ap.add_argument("--fuzz", type=int, default=3000, help="mutated inputs per kind")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--parts", default="spoof,fuzz,kills,restarts,recalls",
                    help="comma-separated subset of spoof,fuzz,kills,restarts,recalls")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    t = Tally()
    parts = {
        "spoof": lambda: part_spoof(t),
        "fuzz": lambda: part_fuzz(t, args.fuzz, rng),
        "kills": lambda: part_kills(t, args.kills, rng),
        "restarts": lambda: part_restarts(t),
        "recalls": lambda: part_recalls(t, args.recalls, rng),
    }
    started = time.monotonic()
    for name in args.parts.split(","):
        t0 = time.monotonic()
        parts[name.strip()]()
        print(f"  ({name}: {time.monotonic() - t0:.0f} s)", flush=True)
    print()
    print(f"{'what':<12}{'count':>8}  goal")
    for label, value, goal in (("kills", t.kills, ">= 20"), ("lost", t.lost, "0"), ("duplicated", t.duplicated, "0"),
                               ("recalls", t.recalls, ">= 100"), ("orphans", t.orphans, "0"),
                               ("fuzz cases", t.fuzz, ""), ("tracebacks", t.tracebacks, "0"),
                               ("spoofed", t.spoofed, ""), ("accepted", t.accepted, "0")):
        print(f"{label:<12}{value:>8}  {goal}")
    met = t.lost == t.duplicated == t.orphans == t.tracebacks == t.accepted == 0
    print(f"goals {'met' if met else 'NOT met'} in {time.monotonic() - started:.0f} s")
    print(f"faults: {t.kills} kills, {t.lost} lost, {t.duplicated} duplicated, {t.recalls} recalls, "
          f"{t.orphans} orphans, {t.fuzz} fuzz cases, {t.tracebacks} tracebacks, "
          f"{t.spoofed} spoofed reports, {t.accepted} accepted")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
