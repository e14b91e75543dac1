"""A real Slurm cluster on this machine: munged, slurmctld and one ``slurmd -N nodeX`` per node.

    python -m tests.clusters.slurm_cluster install          # apt-get slurm-wlm munge when missing
    python -m tests.clusters.slurm_cluster up --nodes 4     # run until Ctrl-C, print SLURM_CONF
    python -m tests.clusters.slurm_cluster check            # start, show sinfo, stop

Everything lives in one state directory: the config, a private munge key and
socket, spool, logs and pid files (``%n`` in the per-node paths). Partitions:
``prod`` (PriorityTier 10) and ``preemptable`` (PriorityTier 1, the pilots'),
``PreemptType=preempt/partition_prio``, ``PreemptMode=CANCEL``. The cluster
stops only what it started, by PID (munged included), after cancelling its
jobs. Client commands find it through ``SLURM_CONF`` (see :attr:`env`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self, Sequence

import psutil

from .common import ClusterUnavailable, LocalCluster, apt_get_install, hold_until_stopped, tail
from .common import failing_command as wrapped_command

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
APT_PACKAGES = ("slurm-wlm", "munge")
GRACE_TIME_S = 5
"""GraceTime of the preemptable partition: a preempted pilot gets SIGTERM, SIGKILL this much later."""
GPUS_PER_NODE = 4
"""GPUs each test node declares (``Gres=gpu:4``): the node shape a GPU machine reports."""


def missing_binaries() -> list[str]:
    return [b for b in SLURM_BINARIES if _which(b) is None]


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def install(timeout: float = 900.0) -> None:
    """``apt-get install slurm-wlm munge`` when a binary is missing; :class:`ClusterUnavailable` if impossible."""
    missing = missing_binaries()
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"Slurm is not installed (missing {', '.join(missing)}) and we are not root")
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable(f"Slurm is not installed (missing {', '.join(missing)}) and there is no apt-get")
    apt_get_install(APT_PACKAGES, timeout)
    still = missing_binaries()
    if still:
        raise ClusterUnavailable(f"installed {' '.join(APT_PACKAGES)} but still missing {', '.join(still)}")


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that are free now."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def node_names(n: int) -> tuple[str, ...]:
    return tuple(f"node{i + 1}" for i in range(n))


def render_config(
    root: Path, nodes: Sequence[str], ctld_port: int, node_ports: Sequence[int], grace_s: int = GRACE_TIME_S,
    gpus: int = GPUS_PER_NODE,
) -> str:
    """slurm.conf for ``nodes`` on localhost, each slurmd on its own port, each declaring ``gpus`` GPUs
    (``Gres=gpu:N``; the node's shape the scavenger reads) (pure)."""
    lines = [
        "ClusterName=malletrain",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={node_ports[0]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_min_interval=0",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=CANCEL",
        "ReturnToService=2",
        "MinJobAge=600",
        "KillWait=5",
        "InactiveLimit=0",
        "SlurmdTimeout=300",
        "MessageTimeout=10",
        "TreeWidth=65533",
    ]
    if gpus:
        lines.append("GresTypes=gpu")
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    for name, port in zip(nodes, node_ports):
        lines.append(f"NodeName={name} NodeHostname=localhost Port={port} CPUs=1 RealMemory=100{gres} State=UNKNOWN")
    all_nodes = ",".join(nodes)
    lines.append(f"PartitionName=prod Nodes={all_nodes} PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP")
    lines.append(
        f"PartitionName=preemptable Nodes={all_nodes} PriorityTier=1 PreemptMode=CANCEL GraceTime={grace_s}"
        " Default=YES MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


def render_gres(nodes: Sequence[str], dev_dir: Path, gpus: int = GPUS_PER_NODE) -> str:
    """gres.conf: ``gpus`` GPUs on each node (pure). The test machine has no GPU and the scavenger reads
    the count alone, but this Slurm's slurmd drops a GPU without a device file ("Removing file-less
    GPU") and the node then registers INVAL, so each GPU names a stand-in under ``dev_dir`` (a link to
    ``/dev/null``, made by :meth:`SlurmCluster.start`); no GPU is detected or used."""
    if not gpus:
        return ""
    files = f"{dev_dir}/gpu[0-{gpus - 1}]" if gpus > 1 else f"{dev_dir}/gpu0"
    return "AutoDetect=off\n" + "".join(f"NodeName={name} Name=gpu File={files}\n" for name in nodes)


@dataclass
class SlurmCluster(LocalCluster):
    """A private Slurm cluster of ``n_nodes`` nodes rooted at ``root`` (a new temp dir by default)."""

    n_nodes: int = 4
    root: Path | None = None
    grace_s: int = GRACE_TIME_S
    gpus_per_node: int = GPUS_PER_NODE
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _own_root: bool = False

    def __post_init__(self) -> None:
        if self.n_nodes < 1:
            raise ValueError(f"slurm cluster: n_nodes must be >= 1, got {self.n_nodes}")
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="mt-slurm-"))
            self._own_root = True
        self.root = Path(self.root).resolve()
        self.nodes = node_names(self.n_nodes)

    # -- paths and environment
    @property
    def conf(self) -> Path:
        assert self.root is not None
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client command needs to reach this cluster (``SLURM_CONF``)."""
        return {"SLURM_CONF": str(self.conf)}

    # -- start
    def start(self, timeout: float = 60.0) -> Self:
        """Install when missing, write the config, start munged, slurmctld, the slurmds; wait until idle."""
        install()
        assert self.root is not None
        for sub in ("munge", "state", "spool", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.root / "munge", 0o700)
        ctld_port, *node_ports = free_ports(self.n_nodes + 1)
        self.conf.write_text(render_config(self.root, self.nodes, ctld_port, node_ports, self.grace_s,
                                           self.gpus_per_node))
        dev_dir = self.root / "dev"
        dev_dir.mkdir(exist_ok=True)
        for i in range(self.gpus_per_node):
            if not (dev_dir / f"gpu{i}").is_symlink():
                (dev_dir / f"gpu{i}").symlink_to("/dev/null")  # a character device slurmd accepts
        (self.root / "gres.conf").write_text(render_gres(self.nodes, dev_dir, self.gpus_per_node))  # beside slurm.conf
        try:
            self._start_munged()
            self._spawn("slurmctld", [_req("slurmctld"), "-D", "-c", "-i", "-f", str(self.conf)])
            for node in self.nodes:
                self._spawn(f"slurmd-{node}", [_req("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munged(self) -> None:
        assert self.root is not None
        d = self.root / "munge"
        key = d / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._spawn(
            "munged",
            [
                _req("munged"), "-F", "--force", f"--socket={d}/munge.socket", f"--key-file={key}",
                f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed",
            ],
        )
        deadline = time.monotonic() + 15.0
        while not (d / "munge.socket").exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"munged did not create its socket in 15 s; see {d}/munged.log")
            time.sleep(0.05)

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.root is not None
        out = open(self.root / "log" / f"{name}.out", "ab")
        try:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.client_env(), start_new_session=True,
            )
        finally:
            out.close()

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                assert self.root is not None
                log = tail(self.root / "log" / f"{name}.out") or tail(self.root / "log" / f"{name}.log")
                raise ClusterUnavailable(f"{name} exited with {code} at start: {log}")

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            res = self.run(["sinfo", "-N", "-h", "-p", "preemptable", "-o", "%N %t"], check=False)
            last = res.stdout.strip() or res.stderr.strip()
            states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
            if res.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.2)
        raise ClusterUnavailable(f"nodes not idle after {timeout:g} s; last sinfo: {last[:300]}")

    # -- use
    def cancel_all(self, timeout: float = 30.0) -> bool:
        """Cancel every job of this cluster and wait until none runs; True if they all left."""
        res = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10.0)
        ids = res.stdout.split()
        if ids:
            self.run(["scancel", *ids], check=False, timeout=10.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10.0)
            if res.returncode == 0 and not res.stdout.split():
                return True
            time.sleep(0.2)
        return False

    # -- stop
    def stop(self) -> None:
        """Cancel the jobs, stop the slurmds, slurmctld, then munged (by PID); idempotent."""
        if not self.procs:
            return
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.cancel_all(timeout=20.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        order = [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            proc = self.procs.pop(name, None)
            if proc is not None:
                _stop(proc)
        for proc in self.procs.values():
            _stop(proc)
        self.procs.clear()
        self._kill_leftovers()
        if self._own_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """Job processes (slurmstepd's children) that still name this cluster's config: by PID."""
        needle = str(self.conf)
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.pid == os.getpid():
                    continue
                if needle in " ".join(p.info["cmdline"] or []) or p.environ().get("SLURM_CONF") == needle:
                    p.kill()
            except psutil.Error:
                pass


def failing_command(dirpath: Path, name: str) -> Path:
    """A wrapper script ``dirpath/name`` around Slurm's ``name`` (put ``dirpath`` first on PATH): it hangs
    while ``dirpath/hang`` exists, fails as an unreachable controller does while ``dirpath/fail`` exists,
    and runs the real command otherwise (tests of a scheduler that stops answering)."""
    return wrapped_command(dirpath, name, "/usr/bin/" + name, [f"{name}: error: Unable to contact slurm controller"], 1)


def _req(name: str) -> str:
    path = _which(name)
    if path is None:
        raise ClusterUnavailable(f"{name} not found on PATH or in /usr/sbin")
    return path


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5.0)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.clusters.slurm_cluster", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("install", "up", "check"))
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--dir", default=None, help="state directory (default: a new temporary one, removed at stop)")
    args = ap.parse_args(argv)
    try:
        if args.command == "install":
            install()
            print("slurm: installed:", ", ".join(SLURM_BINARIES))
            return 0
        cluster = SlurmCluster(args.nodes, Path(args.dir) if args.dir else None)
        with cluster:
            print(f"export SLURM_CONF={cluster.conf}", flush=True)
            print(cluster.run(["sinfo"]).stdout, flush=True)
            if args.command == "up":
                hold_until_stopped()
        return 0
    except ClusterUnavailable as exc:
        print(f"slurm cluster: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

