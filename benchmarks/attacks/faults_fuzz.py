"""The fuzz part of ``benchmarks/attacks/bench_faults.py``: mutated trace files, job files, daemon configs,
monitor frames and control requests (see that file's docstring)."""

from __future__ import annotations

import gzip
import json
import random
import signal
import socket
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from faults_common import ROOT, TOY_CONFIG, TOY_JOB, Daemon, Tally, cli, stop_and_count, workdir

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
    from malletrain.daemon.config import ConfigError, load_config
    from malletrain.daemon.jobspec import JobSpecError, load_spec
    from contract.messages import Report, new_secret, secret_key
    from malletrain.daemon.monitor import Monitor

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
        stop_and_count(d, t)


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
