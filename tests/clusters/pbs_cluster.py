"""A real OpenPBS cluster on this machine: server, scheduler, comm and one MoM with N vnodes.

    python -m tests.clusters.pbs_cluster install            # build (cached) and install OpenPBS as root
    python -m tests.clusters.pbs_cluster up --vnodes 4      # run until Ctrl-C
    python -m tests.clusters.pbs_cluster check              # start, show pbsnodes and queues, stop

How it is built and cached, why its daemons run in a private mount namespace, its queues (``prod``,
an express queue, and ``preemptable``, the pilots') and why root may submit: docs/operators/pbs.md
(a PBS test cluster on one machine). PBS is one per machine: a :class:`PbsCluster` refuses to start
while PBS daemons run that it did not start.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Self, Sequence

import psutil

from .common import ClusterUnavailable, LocalCluster, apt_get_install, hold_until_stopped, run_command, tail
from .common import failing_command as wrapped_command

PREFIX = Path("/opt/pbs")
PBS_HOME = Path("/var/spool/pbs")
PBS_CONF = Path("/etc/pbs.conf")
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONFIGURE_ARGS = (f"--prefix={PREFIX}", "--with-python=/usr")
BUILD_DEPS = (
    "gcc", "g++", "make", "libtool", "autoconf", "automake", "pkg-config", "perl", "swig",
    "libhwloc-dev", "libx11-dev", "libxt-dev", "libxext-dev", "libxft-dev", "libedit-dev", "libical-dev",
    "libncurses-dev", "libexpat1-dev", "libssl-dev", "libcjson-dev", "python3-dev", "tcl-dev", "tk-dev",
)
RUN_DEPS = ("postgresql", "postgresql-contrib", "postgresql-server-dev-all", "expat", "libedit2", "libical3",
            "libcjson1", "tcl", "tk")
"""Debian 12 package names (``libncurses-dev``, ``libexpat1-dev``: the virtual names fail ``dpkg -s``)."""
DAEMONS = ("pbs_server.bin", "pbs_sched", "pbs_comm", "pbs_mom")
KILL_DELAY_S = 2
"""The preemptable queue's ``kill_delay`` in the tests: SIGTERM, then SIGKILL this much later."""
VNODE_SCRIPT = "malletrain_vnodes"
INSTALLED_MARK = PREFIX / ".malletrain-installed"
PACKED = "openpbs-install.tar.gz"


class PreemptOrder(str, Enum):
    """The scheduler's ``preempt_order`` for the pilots (S suspends: a scavenger must not use it)."""

    REQUEUE = "R"
    DELETE = "D"
    SUSPEND = "S"


# ---- build and install ------------------------------------------------------------------------


def source_tarball() -> Path:
    """The OpenPBS source: ``$MALLETRAIN_PBS_SOURCE`` (a file), else the first
    ``shared/vendor/openpbs-*.tar.gz`` beside this checkout or one of its parents."""
    env = os.environ.get("MALLETRAIN_PBS_SOURCE")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ClusterUnavailable(f"MALLETRAIN_PBS_SOURCE={env} is not a file")
        return path
    here = Path(__file__).resolve()
    for parent in (*here.parents, Path.cwd().resolve(), *Path.cwd().resolve().parents):
        found = sorted((parent / "shared" / "vendor").glob("openpbs-*.tar.gz"))
        if found:
            return found[-1]
    raise ClusterUnavailable("no OpenPBS source: set MALLETRAIN_PBS_SOURCE or put openpbs-*.tar.gz in shared/vendor")


def cache_dir(source: Path) -> Path:
    """``$MALLETRAIN_PBS_CACHE`` or ``~/.cache/malletrain/openpbs``, then the build key."""
    h = hashlib.sha256()
    with open(source, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(" ".join(CONFIGURE_ARGS).encode())
    base = Path(os.environ.get("MALLETRAIN_PBS_CACHE") or Path.home() / ".cache" / "malletrain" / "openpbs")
    return base / h.hexdigest()[:16]


def installed() -> bool:
    return INSTALLED_MARK.is_file() and (PREFIX / "sbin" / "pbs_server.bin").is_file()


def install(jobs: int = 2, log: Any = None, build_missing: bool = True) -> None:
    """Install OpenPBS into ``/opt/pbs`` when missing (root): Debian packages, then the cached
    build (built first when the cache lacks it, unless ``build_missing`` is False: a build
    takes minutes), then ``pbs_postinstall``."""
    if installed() and PBS_CONF.is_file():
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable("OpenPBS is not installed in /opt/pbs and we are not root")
    if not installed() and not build_missing and not (cache_dir(source_tarball()) / PACKED).is_file():
        raise ClusterUnavailable("OpenPBS is neither installed nor built: run "
                                 "`python -m tests.clusters.pbs_cluster install` as root first (minutes)")
    say = log or (lambda msg: print(f"pbs: {msg}", file=sys.stderr, flush=True))
    _apt_install([*BUILD_DEPS, *RUN_DEPS], say)
    if not installed():
        packed = build(jobs, say)
        say(f"unpacking {packed} into /")
        with tarfile.open(packed) as tar:
            tar.extractall("/", filter="fully_trusted")
        INSTALLED_MARK.write_text(f"{packed}\n")
    _postinstall(say)


def build(jobs: int = 2, say: Any = print) -> Path:
    """The packed install tree of the source's build, building it when the cache lacks it."""
    source = source_tarball()
    cache = cache_dir(source)
    packed = cache / PACKED
    if packed.is_file():
        return packed
    cache.mkdir(parents=True, exist_ok=True)
    src, stage, logs = cache / "src", cache / "stage", cache / "logs"
    logs.mkdir(exist_ok=True)
    env = {"PATH": CLEAN_PATH, "HOME": str(Path.home()), "LANG": "C"}  # no pyenv/venv python baked in
    if not (src / "configure.ac").is_file():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        say(f"unpacking {source}")
        _run(["tar", "-xzf", str(source), "-C", str(src), "--strip-components=1"], env, logs / "untar.log", 300)
    steps: list[tuple[str, list[str], Path, float]] = []
    if not (src / "configure").is_file():
        steps.append(("autogen", ["./autogen.sh"], src, 600))
    build_dir = cache / "build"
    build_dir.mkdir(exist_ok=True)
    if not (build_dir / "Makefile").is_file():
        steps.append(("configure", [str(src / "configure"), *CONFIGURE_ARGS], build_dir, 900))
    steps.append(("make", ["make", f"-j{jobs}"], build_dir, 3600))
    shutil.rmtree(stage, ignore_errors=True)
    steps.append(("make install", ["make", "install", f"DESTDIR={stage}"], build_dir, 900))
    for name, argv, cwd, timeout in steps:
        t0 = time.monotonic()
        _run(argv, env, logs / f"{name.replace(' ', '-')}.log", timeout, cwd)
        say(f"{name}: {time.monotonic() - t0:.0f} s")
    tmp = packed.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for top in sorted(stage.iterdir()):
            tar.add(top, arcname=top.name)
    tmp.rename(packed)
    shutil.rmtree(stage, ignore_errors=True)
    say(f"packed {packed} ({packed.stat().st_size >> 20} MiB)")
    return packed


def _run(argv: list[str], env: dict[str, str], log: Path, timeout: float, cwd: Path | None = None) -> None:
    with open(log, "w") as out:
        try:
            proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ClusterUnavailable(f"{' '.join(argv)} timed out after {timeout:g} s; see {log}") from None
    if proc.returncode != 0:
        raise ClusterUnavailable(f"{' '.join(argv)} failed with exit {proc.returncode}: {tail(log, 600)}")


def _apt_install(packages: Sequence[str], say: Any) -> None:
    missing = [p for p in packages if subprocess.run(["dpkg", "-s", p], capture_output=True, timeout=30,
                                                     check=False).returncode != 0]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable(f"missing Debian packages {' '.join(missing)} and there is no apt-get")
    say(f"apt-get install {' '.join(missing)}")
    apt_get_install(missing, 1800, ["--no-install-recommends"])


def _postinstall(say: Any) -> None:
    for name in ("pbs_iff", "pbs_rcp"):  # setuid root, as upstream's CI does
        os.chmod(PREFIX / "sbin" / name, 0o4755)
    if not PBS_CONF.is_file() or not (PBS_HOME / "server_priv").is_dir():
        say("pbs_postinstall server")
        log = Path(tempfile.gettempdir()) / "malletrain-pbs-postinstall.log"
        _run([str(PREFIX / "libexec" / "pbs_postinstall"), "server"], dict(os.environ, PATH=CLEAN_PATH), log, 300)


# ---- the cluster ------------------------------------------------------------------------------


def render_pbs_conf(text: str, host: str) -> str:
    """``/etc/pbs.conf`` with server, scheduler, comm and MoM started on ``host`` (pure)."""
    want = {"PBS_START_SERVER": "1", "PBS_START_SCHED": "1", "PBS_START_COMM": "1", "PBS_START_MOM": "1",
            "PBS_SERVER": host}
    lines, seen = [], set()
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if key in want:
            lines.append(f"{key}={want[key]}")
            seen.add(key)
        else:
            lines.append(line)
    lines += [f"{k}={v}" for k, v in want.items() if k not in seen]
    return "\n".join(lines) + "\n"


GPUS_PER_VNODE = 4  # resources_available.ngpus of each test vnode: the node shape a GPU machine reports


def render_vnodes(host: str, vnodes: Sequence[str], gpus: int = GPUS_PER_VNODE) -> str:
    """MoM's vnode definition file: the host's vnode gets no CPUs, so jobs land on ``vnN`` (``gpus`` GPUs each)."""
    lines = ["$configversion 2", f"{host}: resources_available.ncpus = 0"]
    for v in vnodes:
        lines += [f"{v}: resources_available.ncpus = 1", f"{v}: resources_available.mem = 1gb"]
        if gpus:
            lines.append(f"{v}: resources_available.ngpus = {gpus}")
    return "\n".join(lines) + "\n"


def render_hosts(hosts_text: str, host: str, ip: str) -> str:
    """``/etc/hosts`` for the daemons' namespace: ``host`` -> ``ip`` (a non-loopback address)."""
    keep = [ln for ln in hosts_text.splitlines()
            if host not in ln.split()[1:] and not ln.startswith("127.0.1.1")]
    return "\n".join([*keep, f"{ip} {host}"]) + "\n"


def non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def resolves_to_loopback_only(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET)
    except socket.gaierror:
        return True
    return all(str(info[4][0]).startswith("127.") for info in infos)


def vnode_names(n: int) -> tuple[str, ...]:
    return tuple(f"vn{i}" for i in range(n))


def pbs_daemon_pids() -> dict[str, int]:
    """The PBS daemons running here, by name; not a zombie (an exited daemon no one reaped)."""
    return {p.info["name"]: p.info["pid"] for p in psutil.process_iter(["pid", "name", "status"])
            if p.info["name"] in DAEMONS and p.info["status"] != psutil.STATUS_ZOMBIE}


@dataclass
class PbsCluster(LocalCluster):
    """OpenPBS on this machine with ``n_vnodes`` vnodes ``vn0..`` behind one MoM (see the module doc).

    ``user``: who submits jobs in :meth:`run_as_user` (jobs by root run too: ``acl_roots``).
    ``root``: a work directory for the hosts file, logs and job output (a new temp dir by default).
    """

    n_vnodes: int = 4
    kill_delay_s: int = KILL_DELAY_S
    preempt_order: PreemptOrder = PreemptOrder.REQUEUE
    root: Path | None = None
    user: str = "pbsuser"
    started: bool = False
    _own_root: bool = False
    host: str = field(default_factory=socket.gethostname)

    def __post_init__(self) -> None:
        if self.n_vnodes < 1:
            raise ValueError(f"pbs cluster: n_vnodes must be >= 1, got {self.n_vnodes}")
        if self.kill_delay_s < 1:
            raise ValueError(f"pbs cluster: kill_delay_s must be >= 1, got {self.kill_delay_s}")
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="mt-pbs-"))
            self._own_root = True
        self.root = Path(self.root).resolve()
        self.vnodes = vnode_names(self.n_vnodes)

    # -- environment
    @property
    def env(self) -> dict[str, str]:
        """What a client command needs: PBS's ``bin`` on PATH."""
        return {"PATH": f"{PREFIX / 'bin'}:{os.environ.get('PATH', CLEAN_PATH)}"}

    @property
    def jobdir(self) -> Path:
        assert self.root is not None
        return self.root / "jobs"

    # -- start
    def start(self, timeout: float = 90.0) -> Self:
        """Install from the cached build when missing, configure, start the daemons, make the queues;
        wait until every vnode is free."""
        install(build_missing=False)
        running = pbs_daemon_pids()
        if running:
            raise ClusterUnavailable(f"PBS daemons already run on this machine ({', '.join(running)}): "
                                     "one PBS per machine; stop them first (pbs_cluster down)")
        assert self.root is not None
        (self.root / "log").mkdir(parents=True, exist_ok=True)
        self.jobdir.mkdir(exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.jobdir, 0o1777)
        self._ensure_user()
        PBS_CONF.write_text(render_pbs_conf(PBS_CONF.read_text(), self.host))
        self._write_mom_config()
        self.started = True
        try:
            self._init_d("start", timeout)
            self._wait("the server answers", lambda: self.run(["qstat", "-B"], check=False).returncode == 0, 60)
            self._configure()
            self._wait(f"{self.n_vnodes} vnodes free", lambda: self.free_vnodes() == set(self.vnodes), timeout)
            self._declare_gpus()
        except BaseException:
            self.stop()
            raise
        return self

    def _ensure_user(self) -> None:
        if subprocess.run(["id", self.user], capture_output=True, timeout=10, check=False).returncode != 0:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", self.user], capture_output=True, timeout=30,
                           check=True)

    def _write_mom_config(self) -> None:
        assert self.root is not None
        defs = self.root / "vnodes.def"
        defs.write_text(render_vnodes(self.host, self.vnodes))
        cfg = PBS_HOME / "mom_priv" / "config"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        old = cfg.read_text().splitlines() if cfg.exists() else []
        keep = [ln for ln in old if not ln.startswith(("$min_check_poll", "$max_check_poll", "$clienthost"))]
        poll = self.kill_delay_s  # MoM's poll equal to kill_delay measured best
        cfg.write_text("\n".join([*keep, f"$min_check_poll {poll}", f"$max_check_poll {max(poll, 5)}"]) + "\n")
        mom = str(PREFIX / "sbin" / "pbs_mom")
        subprocess.run([mom, "-s", "remove", VNODE_SCRIPT], capture_output=True, timeout=30, check=False)
        proc = subprocess.run([mom, "-s", "insert", VNODE_SCRIPT, str(defs)], capture_output=True, text=True,
                              timeout=30, check=False)
        if proc.returncode != 0:
            raise ClusterUnavailable(f"pbs_mom -s insert failed: {proc.stderr.strip()[:300]}")

    def _init_d(self, action: str, timeout: float) -> None:
        """``pbs_init.d start|stop``, in a private mount namespace with a usable /etc/hosts if needed."""
        assert self.root is not None
        argv = [str(PREFIX / "libexec" / "pbs_init.d"), action]
        if resolves_to_loopback_only(self.host):
            ip = non_loopback_ipv4()
            if ip is None:
                raise ClusterUnavailable("no non-loopback IPv4 address here; PBS cannot start")
            hosts = self.root / "hosts"
            hosts.write_text(render_hosts(Path("/etc/hosts").read_text(), self.host, ip))
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                    'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *argv]
        log = self.root / "log" / f"init-{action}.log"
        log.parent.mkdir(parents=True, exist_ok=True)  # `down` stops daemons a cluster of an earlier process started
        _run(argv, dict(os.environ, PATH=CLEAN_PATH), log, timeout)

    def _configure(self) -> None:
        q = self.qmgr
        if self.run(["pbsnodes", "-v", self.host], check=False).returncode != 0:
            q(f"create node {self.host}")
        for name in self.nodes():  # vnodes of an earlier start with more of them: "Stale" forever
            if name != self.host and name not in self.vnodes:
                q(f"delete node {name}")
        for line in (
            "set server job_history_enable = False",  # purges the history of an earlier start
            "set server job_history_enable = True",
            "set server job_history_duration = 01:00:00",
            "set server scheduler_iteration = 10",
            "set server flatuid = True",
            f"set server acl_roots = {getpass.getuser()}",
        ):
            q(line)
        for name, prio in (("prod", 200), ("preemptable", 10)):
            if self.run(["qmgr", "-c", f"list queue {name}"], check=False).returncode != 0:
                q(f"create queue {name} queue_type=execution")
            q(f"set queue {name} priority = {prio}, enabled = True, started = True")
        q(f"set queue preemptable kill_delay = {self.kill_delay_s}")
        q('set sched default preempt_prio = "express_queue, normal_jobs"')
        self.set_preempt_order(self.preempt_order)
        q("set sched default scheduling = True")

    def _declare_gpus(self) -> None:
        """``resources_available.ngpus`` on every vnode (``ngpus``: a site resource, created when missing)."""
        if self.run(["qmgr", "-c", "list resource ngpus"], check=False).returncode != 0:
            self.qmgr("create resource ngpus type=long, flag=nh")
        for v in self.vnodes:
            self.qmgr(f"set node {v} resources_available.ngpus = {GPUS_PER_VNODE}")

    def set_preempt_order(self, order: PreemptOrder) -> None:
        self.qmgr(f"set sched default preempt_order = {PreemptOrder(order).value}")
        self.preempt_order = PreemptOrder(order)

    def _wait(self, what: str, pred: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.3)
        raise ClusterUnavailable(f"{what}: not within {timeout:g} s")

    # -- use
    def run_as_user(self, argv: Sequence[str], check: bool = True,
                    timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a PBS client command as :attr:`user` (``runuser``), in :attr:`jobdir`."""
        full = ["runuser", "-u", self.user, "--", "env", f"PATH={self.env['PATH']}", *argv]
        return run_command(full, None, check, timeout, self.jobdir)

    def qmgr(self, command: str) -> None:
        self.run(["qmgr", "-c", command])

    def qsub(self, queue: str, vnodes: Sequence[str], command: Sequence[str], walltime: str = "00:10:00",
             as_user: bool = True) -> str:
        """Submit ``command`` (run directly, no script) to ``queue`` on ``vnodes``; the job id."""
        select = "+".join(f"1:ncpus=1:vnode={v}" for v in vnodes)
        argv = ["qsub", "-q", queue, "-l", f"select={select}", "-l", f"walltime={walltime}", "-j", "oe",
                "-o", "/dev/null", "--", *command]
        res = (self.run_as_user if as_user else self.run)(argv)
        return res.stdout.strip()

    def job(self, job: str) -> dict[str, Any]:
        """``qstat -x -f -F json JOB``'s attributes ({} when unknown)."""
        res = self.run(["qstat", "-x", "-f", "-F", "json", job], check=False)
        if res.returncode != 0 or not res.stdout.strip():
            return {}
        return dict(json.loads(res.stdout).get("Jobs", {}).get(job, {}))

    def job_state(self, job: str) -> str:
        return str(self.job(job).get("job_state", ""))

    def nodes(self) -> dict[str, dict[str, Any]]:
        res = self.run(["pbsnodes", "-av", "-F", "json"], check=False)
        if res.returncode != 0 or not res.stdout.strip():
            return {}
        return dict(json.loads(res.stdout).get("nodes", {}))

    def free_vnodes(self) -> set[str]:
        return {n for n, a in self.nodes().items() if n in self.vnodes and a.get("state") == "free"
                and not a.get("jobs")}

    def job_ids(self) -> list[str]:
        """Every job the server has that is not finished."""
        res = self.run(["qselect"], check=False)
        return res.stdout.split() if res.returncode == 0 else []

    def delete_all(self, timeout: float = 30.0) -> bool:
        """``qdel -W force`` every job and wait until every vnode is free; True if they are."""
        ids = self.job_ids()
        if ids:
            self.run(["qdel", "-W", "force", *ids], check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.job_ids() and self.free_vnodes() == set(self.vnodes):
                return True
            time.sleep(0.3)
        return False

    # -- stop
    def stop(self) -> None:
        """Delete the jobs, stop the daemons (and PBS's PostgreSQL); idempotent."""
        if not self.started:
            return
        self.started = False
        try:
            if self.run(["qstat", "-B"], check=False, timeout=10).returncode == 0:
                self.delete_all(timeout=15.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            self._init_d("stop", 120.0)
        except ClusterUnavailable:
            pass
        deadline = time.monotonic() + 30
        while pbs_daemon_pids() and time.monotonic() < deadline:
            time.sleep(0.3)
        for name, pid in pbs_daemon_pids().items():  # ours: we refused to start beside others
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._own_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def failing_command(dirpath: Path, name: str) -> Path:
    """A wrapper ``dirpath/name`` around PBS's ``name`` (put ``dirpath`` first on PATH): it hangs
    while ``dirpath/hang`` exists, fails as an unreachable server does while ``dirpath/fail``
    exists, and runs the real command otherwise."""
    failure = ["Connection refused", f"{name}: cannot connect to server $(hostname), error=15010"]
    return wrapped_command(dirpath, name, PREFIX / "bin" / name, failure, 2)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.clusters.pbs_cluster", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("install", "build", "up", "check", "down"))
    ap.add_argument("--vnodes", type=int, default=4)
    ap.add_argument("--kill-delay", type=int, default=KILL_DELAY_S)
    ap.add_argument("--preempt-order", choices=[o.value for o in PreemptOrder], default="R")
    ap.add_argument("--jobs", type=int, default=2, help="make -j for the build")
    args = ap.parse_args(argv)
    try:
        if args.command == "build":
            print(build(args.jobs))
            return 0
        if args.command == "install":
            install(args.jobs)
            print(f"pbs: installed in {PREFIX}")
            return 0
        if args.command == "down":
            pids = pbs_daemon_pids()
            if pids:
                c = PbsCluster()
                c.started = True
                c.stop()
            print(f"pbs: stopped {', '.join(pids) or 'nothing'}")
            return 0
        cluster = PbsCluster(args.vnodes, args.kill_delay, PreemptOrder(args.preempt_order))
        with cluster:
            print(f"export PATH={PREFIX / 'bin'}:$PATH", flush=True)
            print(cluster.run(["pbsnodes", "-aSj"]).stdout, cluster.run(["qstat", "-Q"]).stdout, flush=True)
            if args.command == "up":
                hold_until_stopped()
        return 0
    except ClusterUnavailable as exc:
        print(f"pbs cluster: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
