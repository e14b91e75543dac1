"""What the Slurm and the PBS test clusters share: the error a test skips with, the Debian packages they
install, a client command run against them, the wrapper of a scheduler command that stops answering,
and the ``up`` command that holds a cluster until Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Self, Sequence


class ClusterUnavailable(RuntimeError):
    """The test cluster cannot be installed or started here; the message says why (tests skip with it)."""


class LocalCluster:
    """A scheduler started on this machine: its client commands run with :attr:`env` added to ours."""

    @property
    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def client_env(self) -> dict[str, str]:
        return dict(os.environ, **self.env)

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a client command of this cluster's scheduler (argv, no shell) as the calling user."""
        return run_command(argv, self.client_env(), check, timeout)

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_command(argv: Sequence[str], env: dict[str, str] | None, check: bool = True, timeout: float = 30.0,
                cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``argv`` (no shell) with its output captured; under ``check`` a failure raises naming the command."""
    proc = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc


def apt_get_install(packages: Sequence[str], timeout: float, options: Sequence[str] = ()) -> None:
    """``apt-get update`` then ``apt-get install -y -q [options] packages``; :class:`ClusterUnavailable` naming
    the step that failed or timed out."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *options, *packages]):
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ClusterUnavailable(f"{' '.join(argv[:3])} timed out after {timeout:g} s") from None
        if proc.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(argv[:3])} failed with exit {proc.returncode}: "
                                     f"{(proc.stderr or proc.stdout).strip()[-400:]}")


def failing_command(dirpath: Path, name: str, real: Path | str, failure: Sequence[str], code: int) -> Path:
    """A wrapper script ``dirpath/name`` around the scheduler's command ``real`` (put ``dirpath`` first on
    PATH): it hangs while ``dirpath/hang`` exists, prints the ``failure`` lines to stderr and exits ``code``
    (as when the scheduler cannot be reached) while ``dirpath/fail`` exists, and runs ``real`` otherwise."""
    script = dirpath / name
    fail = "; ".join(f'echo "{line}" >&2' for line in failure)
    script.write_text(
        "#!/bin/sh\n"
        f'if [ -e "{dirpath}/hang" ]; then exec sleep 60; fi\n'
        f'if [ -e "{dirpath}/fail" ]; then {fail}; exit {code}; fi\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return script


def tail(path: Path, n: int = 400) -> str:
    """The last ``n`` characters of a log ("" when it cannot be read)."""
    try:
        return path.read_text(errors="replace").strip()[-n:]
    except OSError:
        return ""


def hold_until_stopped() -> None:
    """Return on Ctrl-C or SIGTERM (``up``: the cluster runs until then)."""
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    try:
        while not stop[0]:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
