"""Test support, not product: a whole elastic job on this machine, without the daemon: runtime +
workers + monitor.

:class:`LocalJob` plays the job manager and the node agents for the ``torch``
runtime: it hosts :class:`~malletrain.runtimes.torch_elastic.TorchRuntime`,
spawns worker processes from their :class:`~malletrain.runtimes.LaunchSpec`
(each in its own session, like an agent does), publishes member lists, kills
workers to simulate recalls and collects the workers' reports on a ZeroMQ
PULL socket (like the monitor). The tests and ``benchmarks/bench_rescale.py``
drive it; ``python -m tests.clusters.localjob`` (from a checkout's root) runs a
short demo (grow 1 -> 2 -> 3, shrink, recall) and prints the pauses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Sequence

import zmq

from contract.messages import MessageError, Report, decode, decode_report
from malletrain.runtimes.torch_elastic import TorchRuntime
from contract.workerenv import DEFAULT_STORE_GRACE_S


@dataclass
class Worker:
    """One spawned worker process and what it printed (``--trace`` JSON lines)."""

    id: str
    proc: subprocess.Popen[bytes]
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def steps(self, gen: int | None = None) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("ev") == "step" and (gen is None or e["gen"] == gen)]

    def rescales(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("ev") == "rescale" and (kind is None or e["kind"] == kind)]


def example_command(*args: str) -> list[str]:
    """argv of the example trainer with this interpreter."""
    return [sys.executable, "-m", "malletrain.worker.examples.train", *args]


class LocalJob:
    """One job's runtime, workers and monitor; a context manager that leaves no process behind."""

    def __init__(self, job: str, command: Sequence[str], *, collective_timeout_s: float = 3.0,
                 store_grace_s: float = DEFAULT_STORE_GRACE_S) -> None:
        self.job = job
        self.command = list(command)
        self._zctx: zmq.Context = zmq.Context.instance()
        self._pull = self._zctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        port = self._pull.bind_to_random_port("tcp://127.0.0.1")
        self.monitor = f"tcp://127.0.0.1:{port}"
        self.runtime = TorchRuntime("127.0.0.1", 0, monitor=self.monitor, collective_timeout_s=collective_timeout_s,
                                    store_grace_s=store_grace_s)
        self.runtime.start()
        self.workers: dict[str, Worker] = {}
        self.reports: list[tuple[float, Report]] = []  # (receive time, report)
        self.bad_frames: list[str] = []
        self._stop = threading.Event()
        self._monitor_thread = threading.Thread(target=self._receive, name="monitor", daemon=True)
        self._monitor_thread.start()

    # -- driving the job ----------------------------------------------------------------
    def spawn(self, worker_id: str, node: str = "localhost", local: tuple[int, int] = (0, 1)) -> Worker:
        """Start worker ``worker_id``; ``local`` = (local rank, K): one of the K processes of a node's
        worker, as an agent starts them (kept as ``worker_id/local_rank`` when K > 1)."""
        spec = self.runtime.launch_spec(self.job, self.command, worker_id, node, slots=local[1])
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        if local[1] > 1:
            env.update(LOCAL_RANK=str(local[0]), LOCAL_WORLD_SIZE=str(local[1]), OMP_NUM_THREADS="1")
            worker_id = f"{worker_id}/{local[0]}"
        proc = subprocess.Popen(
            list(spec.argv), env=env, cwd=spec.cwd, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        worker = Worker(worker_id, proc)
        assert proc.stdout is not None and proc.stderr is not None
        worker.threads = [
            threading.Thread(target=_read_json, args=(proc.stdout, worker.events), daemon=True),
            threading.Thread(target=_read_text, args=(proc.stderr, worker.stderr), daemon=True),
        ]
        for t in worker.threads:
            t.start()
        self.workers[worker_id] = worker
        return worker

    def set_members(self, members: Sequence[str]) -> tuple[int, float]:
        """Publish a member list; returns (generation, time published)."""
        gen = self.runtime.set_members(self.job, members)
        return gen, time.time()

    def kill(self, worker_id: str, sig: int = signal.SIGKILL) -> float:
        """Signal a worker's process group (a recall); returns the time of the kill."""
        proc = self.workers[worker_id].proc
        t = time.time()
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
        return t

    def wait_for(self, what: str, pred: Callable[[], bool], timeout_s: float = 90.0) -> None:
        """Poll ``pred`` until true; on timeout raise with the workers' last stderr lines."""
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job}: timed out after {timeout_s} s waiting for {what}\n{self.diagnostics()}")
            time.sleep(0.02)

    def wait_steps(self, worker_id: str, gen: int, n: int = 1, timeout_s: float = 90.0) -> None:
        w = self.workers[worker_id]
        self.wait_for(f"{n} steps of {worker_id} in generation {gen}", lambda: len(w.steps(gen)) >= n, timeout_s)

    def wait_exit(self, worker_id: str, timeout_s: float = 90.0) -> int:
        proc = self.workers[worker_id].proc
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"worker {worker_id} still running after {timeout_s} s\n{self.diagnostics()}") from None

    def reports_in(self, gen: int) -> list[Report]:
        return [r for _, r in list(self.reports) if r.generation == gen]

    def diagnostics(self) -> str:
        lines = []
        for w in self.workers.values():
            lines.append(f"--- {w.id} (returncode {w.proc.poll()}), last step {w.steps()[-1:]}")
            lines.extend(w.stderr[-15:])
        return "\n".join(lines)

    # -- teardown -------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every worker's process group, stop the monitor and the runtime; idempotent."""
        for w in self.workers.values():
            if w.proc.poll() is None:
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for t in w.threads:
                t.join(timeout=5)
        self._stop.set()
        self._monitor_thread.join(timeout=5)
        self._pull.close(0)
        self.runtime.forget(self.job)
        self.runtime.close()

    def __enter__(self) -> LocalJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _receive(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            frame = self._pull.recv()
            try:
                rep = decode_report(decode(frame))
            except MessageError as exc:
                self.bad_frames.append(str(exc))
                continue
            self.reports.append((time.time(), rep))


def _read_json(stream: IO[bytes], out: list[dict[str, Any]]) -> None:
    for raw in stream:
        line = raw.decode(errors="replace").strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    stream.close()


def _read_text(stream: IO[bytes], out: list[str]) -> None:
    for raw in stream:
        out.append(raw.decode(errors="replace").rstrip())
    stream.close()


def demo() -> int:
    """Grow 1 -> 2 -> 3, shrink to 2, recall one, and print every worker-side pause."""
    cmd = example_command("--model", "mlp", "--width", "256", "--samples", str(10**9), "--trace", "--step-sleep", "0.01")
    with LocalJob("demo", cmd) as job:
        job.spawn("w0")
        g, _ = job.set_members(["w0"])
        job.wait_steps("w0", g, 3)
        job.spawn("w1")
        g, _ = job.set_members(["w0", "w1"])
        job.wait_steps("w1", g, 3)
        job.spawn("w2")
        g, _ = job.set_members(["w0", "w1", "w2"])
        job.wait_steps("w2", g, 3)
        g, _ = job.set_members(["w0", "w2"])
        job.wait_steps("w2", g, 3)
        job.kill("w0")
        g, _ = job.set_members(["w2"])
        job.wait_steps("w2", g, 3)
        job.set_members([])
        for wid in job.workers:
            job.wait_exit(wid)
        for w in job.workers.values():
            for ev in w.rescales():
                print(f"{w.id}: {ev['kind']:8s} g{ev['from']}->g{ev['to']} world {ev['world_before']}->{ev['world_after']}"
                      f" pause {ev['pause'] * 1000:.0f} ms")
        print(f"{len(job.reports)} reports received; world sizes seen: {sorted({r.world_size for _, r in job.reports})}")
    return 0


if __name__ == "__main__":
    sys.exit(demo())
