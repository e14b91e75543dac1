"""What ``malletrain submit`` checks of a job's command before it is recorded, as the submitting user.

:func:`check_command`: the first word is an executable (a path from ``cwd`` or a name on ``PATH``);
for a Python interpreter the script, or the module's top-level package (looked up by that
interpreter in ``cwd`` with the job's ``env``), is there. A missing script used to fail 20 s and
five workers later; now the submit names it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Mapping, Sequence

from malletrain.daemon.jobspec import JobSpecError

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
"""Where a worker that runs as another user finds programs (the agent's own PATH for its user)."""
PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")
PYTHON_OPTS_WITH_ARG = frozenset({"-W", "-X", "-Q"})
FIND_MODULE = ("import importlib.util, sys\n"
               "sys.path.insert(0, '')\n"
               "sys.exit(0 if importlib.util.find_spec(sys.argv[1]) is not None else 3)\n")
FIND_TIMEOUT_S = 30.0


class SubmitCheckError(JobSpecError):
    """A job that cannot run as submitted; the message names the file, folder or program."""


def _program(word: str, cwd: str, env: Mapping[str, str]) -> str | None:
    """The executable ``word`` names (a path, from ``cwd``; else on the job's PATH or the usual one)."""
    if "/" in word:
        path = os.path.join(cwd, word)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    search = os.pathsep.join(p for p in (env.get("PATH"), os.environ.get("PATH"), SAFE_PATH) if p)
    return shutil.which(word, path=search)


def _python_target(argv: Sequence[str]) -> tuple[str, str] | None:
    """``("script", path)`` or ``("module", name)`` that a Python command line runs (None: ``-c``, stdin)."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m",) and i + 1 < len(argv):
            return "module", argv[i + 1]
        if arg.startswith("-m") and len(arg) > 2:
            return "module", arg[2:]
        if arg == "-c" or arg.startswith("-c") or arg == "-":
            return None
        if arg in PYTHON_OPTS_WITH_ARG:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return "script", arg
    return None


def check_command(command: Sequence[str], cwd: str, env: Mapping[str, str], where: str) -> None:
    """The command's program, and a Python command's script or module, can be found from ``cwd``."""
    program = _program(command[0], cwd, env)
    if program is None:
        raise SubmitCheckError(f"{where}: command {command[0]!r} is not an executable file "
                               f"({'from cwd ' + cwd if '/' in command[0] else 'on PATH'})")
    if not PYTHON_NAME.fullmatch(os.path.basename(program)):
        return
    target = _python_target(command)
    if target is None:
        return
    kind, name = target
    if kind == "script":
        if not os.path.isfile(os.path.join(cwd, name)):
            raise SubmitCheckError(f"{where}: script {name} not found (from cwd {cwd})")
        return
    top = name.split(".")[0]
    try:
        res = subprocess.run([program, "-c", FIND_MODULE, top], cwd=cwd, env={**os.environ, **env},
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=FIND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SubmitCheckError(f"{where}: cannot ask {program} for module {name}: {exc}") from None
    if res.returncode == 3:
        raise SubmitCheckError(f"{where}: module {name} not found by {program} (from cwd {cwd})")
