"""Every ```bash block of README.md and of every docs page (docs/**/*.md): short ones run for real,
long ones are marked and checked statically.

Every page's blocks run from the repository root, as a reader pastes them there.

A block runs in a sandbox that looks like a fresh clone: a temporary folder
whose entries are links to the checkout's (``.venv`` included), with
``../shared`` beside it, ``$MALLETRAIN_DATA`` naming the data directory, HOME in the sandbox (so ``~/.malletrain`` is a fresh
state dir) and ``MALLETRAIN_STATE_DIR`` unset. A block that uses only
``.venv/bin/...`` runs with the system PATH, exactly as pasted into a new
shell; a block with bare ``malletrain``/``python`` runs with the venv's bin
first on PATH, as after ``source .venv/bin/activate``. ``bash -e``: any failing
command fails the test.

A block that takes a minute or more (the install, the demo, replays of whole
weeks, the test suite, benchmarks) has an HTML comment on the line before it:
``<!-- readme-test: skip (REASON) -->``. It does not run, but every command in
it is checked: ``malletrain`` arguments parse (argparse, nothing runs), the
scripts, test files and ``-m`` modules it names exist, and bash reads it
(``bash -n``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from procs import procs_mentioning
from traces.data import data_dirs

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]  # the README and every docs page
VENV_BIN = REPO / ".venv" / "bin"
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((?P<reason>.+)\)\s*-->")
BARE = re.compile(r"(?:^|[;&|(]\s*)(?:malletrain|python3?)\s", re.MULTILINE)
HEREDOC = re.compile(r"<<-?\s*'?\"?(?P<end>\w+)'?\"?")
BLOCK_TIMEOUT_S = 600
RUN_STATE_DIR = re.compile(r'^export MALLETRAIN_STATE_DIR="\$PWD/(?P<folder>[^"]+)"', re.MULTILINE)
"""A block that starts a daemon gives it a state folder of its run, below the folder it is pasted in."""
NOT_LINKED = {"runs", ".git", ".pytest_cache", ".hypothesis"}


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence
    section: str
    code: str
    skip: str | None  # the reason, if marked
    page: str = "README.md"  # relative to the repository root

    @property
    def id(self) -> str:
        stem = Path(self.page).stem.lower()
        return f"{stem}-L{self.line}-{re.sub(r'[^a-z0-9]+', '-', self.section.lower()).strip('-')[:30]}"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def page_blocks(path: Path) -> list[Block]:
    """The ```bash blocks of one page, named by its path relative to the repository root."""
    page = path.relative_to(REPO).as_posix()
    return [Block(b.line, b.section, b.code, b.skip, page) for b in readme_blocks(path.read_text(encoding="utf-8"))]


def readme_blocks(text: str) -> list[Block]:
    """The ```bash blocks, each with its section heading and its skip marker (the line before it)."""
    lines = text.splitlines()
    out: list[Block] = []
    section = "top"
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        elif line.lstrip().startswith("```") and line.strip() != "```bash":  # another fenced block: skip it
            fence = line.lstrip()[:3]
            i = next((j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith(fence)), len(lines))
        elif line.strip() == "```bash":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = SKIP.search(before)
            out.append(Block(i + 1, section, "\n".join(lines[i + 1:end]) + "\n",
                             marker.group("reason").strip() if marker else None))
            i = end
        i += 1
    return out


BLOCKS = [b for page in PAGES for b in page_blocks(page)]
RUN = [b for b in BLOCKS if b.skip is None]
SKIPPED = [b for b in BLOCKS if b.skip is not None]


def commands(code: str) -> list[list[str]]:
    """The simple commands of a block (heredoc bodies, comments and operators left out)."""
    out: list[list[str]] = []
    logical: list[str] = []
    pending = ""
    heredoc_end: str | None = None
    for raw in code.splitlines():
        if heredoc_end is not None:
            if raw.strip() == heredoc_end:
                heredoc_end = None
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        logical.append(pending + raw)
        pending = ""
        m = HEREDOC.search(raw)
        if m:
            heredoc_end = m.group("end")
    for line in logical:
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        argv: list[str] = []
        skip_next = False
        for tok in lex:
            if skip_next:
                skip_next = False
            elif tok and set(tok) <= set(";&|()<>"):
                if "<" in tok or ">" in tok:  # a redirection: drop its fd number and its target
                    if argv and argv[-1].isdigit():
                        argv.pop()
                    skip_next = True
                elif argv:
                    out.append(argv)
                    argv = []
            else:
                argv.append(tok)
        if argv:
            out.append(argv)
    return out


def check_command(argv: list[str]) -> str | None:
    """Why this command of a skipped block would fail at once, or None."""
    from malletrain.cli import build_parser

    prog = os.path.basename(argv[0])
    if prog == "malletrain":
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as exc:
            return None if exc.code == 0 else f"malletrain does not accept {shlex.join(argv[1:])}"
        return None
    if prog in ("python", "python3") and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2:
            if argv[2] == "venv":
                return None
            if importlib.util.find_spec(argv[2]) is None:
                return f"no module {argv[2]}"
            files = [a for a in argv[3:] if a.endswith(".py")] if argv[2] == "pytest" else []
        else:
            files = [argv[1]]
        missing = [f for f in files if not (REPO / f).exists()]
        if missing:
            return f"missing {', '.join(missing)}"
        if argv[1].startswith("benchmarks/") and argv[1].endswith(".py") and len(argv) > 2:
            return benchmark_args_error(REPO / argv[1], argv[2:])
        return None
    if prog == "bash" and len(argv) > 1 and not (REPO / argv[1]).exists():
        return f"missing script {argv[1]}"
    return None


class _Parsed(Exception):
    """Raised in place of a benchmark's work, once its arguments parsed."""


def benchmark_args_error(script: Path, args: list[str]) -> str | None:
    """Why ``python SCRIPT ARGS`` would stop at its arguments (argparse's own message), or None. The script's
    ``main`` runs only up to its ``parse_args``, which raises in place of the benchmark's work; a word with
    ``$`` (a shell variable) stands for a value, here ``0``."""
    if "parse_args(" not in script.read_text(encoding="utf-8"):
        return f"{script.name} takes no arguments"
    words = ["0" if "$" in a else a for a in args]
    spec = importlib.util.spec_from_file_location(f"cited_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    original = argparse.ArgumentParser.parse_args
    refused = io.StringIO()

    def parse_only(self: argparse.ArgumentParser, *_: object, **__: object) -> argparse.Namespace:
        with contextlib.redirect_stderr(refused), contextlib.redirect_stdout(refused):
            original(self, words)
        raise _Parsed

    sys.path.insert(0, str(script.parent))  # a benchmark imports its sibling scripts
    sys.modules[spec.name] = module  # where its dataclasses look for their module
    argparse.ArgumentParser.parse_args = parse_only  # type: ignore[assignment,method-assign]
    try:
        spec.loader.exec_module(module)
        module.main()
    except _Parsed:
        return None
    except SystemExit as exc:
        if exc.code == 0:  # --help
            return None
        lines = refused.getvalue().strip().splitlines()
        return f"{script.name} does not accept {shlex.join(args)}: {lines[-1] if lines else exc.code}"
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.path.remove(str(script.parent))
        sys.modules.pop(spec.name, None)
    return f"{script.name}'s main() returned before parsing its arguments"


def sandbox(tmp: Path) -> tuple[Path, dict[str, str]]:
    """A fresh-clone look-alike (links to the checkout), ../shared beside it, and the environment."""
    clone = tmp / "main"
    clone.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in NOT_LINKED:
            (clone / entry.name).symlink_to(entry)
    shared = REPO.parent / "shared"
    if shared.exists():
        (tmp / "shared").symlink_to(shared)
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLETRAIN_") and k != "VIRTUAL_ENV"}
    env["HOME"] = str(home)
    data = next((d for d in [tmp / "shared" / "data", *data_dirs()] if d.is_dir()), None)
    if data is not None:  # the pages name real data as $MALLETRAIN_DATA/<file>
        env["MALLETRAIN_DATA"] = str(data.resolve())
    path = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if Path(p).resolve() != VENV_BIN.resolve()]
    env["PATH"] = os.pathsep.join(path)
    return clone, env


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A scratch folder with a short path for a block that runs: a page's daemon keeps its state below the
    sandbox (``runs/NAME/state``), and its control socket's path must stay within 107 bytes, which pytest's
    ``tmp_path`` is too deep for."""
    top = Path(tempfile.mkdtemp(prefix="mt-readme-"))
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run_block(block: Block, tmp: Path) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    clone, env = sandbox(tmp)
    if BARE.search(block.code):
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"  # as after `source .venv/bin/activate`
    script = tmp / "block.sh"
    script.write_text(block.code)
    bash = shutil.which("bash") or "/bin/bash"
    try:
        res = subprocess.run([bash, "-e", str(script)], cwd=clone, env=env, capture_output=True, text=True,
                             timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.where} ran over {BLOCK_TIMEOUT_S} s: {exc.stdout!r} {exc.stderr!r}")
    return res, clone, Path(env["HOME"])


def test_readme_has_blocks_and_every_skip_has_a_reason() -> None:
    assert any(b.page == "README.md" for b in BLOCKS), "no ```bash block found in README.md"
    assert any("malletrain daemon" in b.code for b in RUN), "the daemon example must run, not be skipped"
    assert all(b.skip for b in SKIPPED)


def test_every_docs_page_is_checked() -> None:
    pages = {p.relative_to(REPO).as_posix() for p in PAGES}
    for name in ("operators.md", "training.md", "research.md", "design.md", "figures.md", "index.md"):
        assert f"docs/{name}" in pages
    assert {b.page for b in BLOCKS} >= {"README.md", "docs/operators.md", "docs/training.md", "docs/research.md"}


def test_a_docs_page_block_is_found_with_its_page_and_marker() -> None:
    text = "# T\n\n<!-- readme-test: skip (long) -->\n```bash\nmalletrain --help\n```\n"
    (blocks,) = [Block(b.line, b.section, b.code, b.skip, "docs/x.md") for b in readme_blocks(text)]
    assert (blocks.page, blocks.line, blocks.skip, blocks.id) == ("docs/x.md", 4, "long", "x-L4-t")


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_bash_reads_every_block(block: Block) -> None:
    res = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, f"{block.where}: {res.stderr}"


@pytest.mark.parametrize("block", SKIPPED, ids=[b.id for b in SKIPPED])
def test_skipped_blocks_name_real_commands(block: Block) -> None:
    problems = [(shlex.join(argv), why) for argv in commands(block.code) if (why := check_command(argv))]
    assert not problems, f"{block.where} ({block.skip}): {problems}"


def test_readme_steps_leave_the_checkout_clean() -> None:
    """What the two commands, the Horovod build and the docs build write is ignored by git."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    written = [".venv/bin/python", "runs/demo/report.md", "malletrain.egg-info/PKG-INFO", ".pytest_cache/README.md",
               ".hypothesis/examples/x", "site/index.html", "tests/__pycache__/x.pyc", "daemon.toml", "job.toml",
               "daemon.log"]
    res = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=REPO, capture_output=True, text=True,
                         timeout=30)
    assert sorted(res.stdout.split()) == sorted(written), f"not ignored: {set(written) - set(res.stdout.split())}"


def test_command_splitting() -> None:
    code = ("cat > a <<'T'\nx = 1\nT\nmalletrain simulate --out r \\\n    --quiet  # note\n"
            "malletrain daemon > d.log 2>&1 &\nkill %1; wait\n")
    assert commands(code) == [["cat"], ["malletrain", "simulate", "--out", "r", "--quiet"],
                              ["malletrain", "daemon"], ["kill", "%1"], ["wait"]]
    assert check_command(["malletrain", "simulate", "--no-such-option"]) is not None
    assert check_command(["python", "benchmarks/no_such_bench.py"]) == "missing benchmarks/no_such_bench.py"
    why = check_command(["python", "benchmarks/bench_pbs.py", "--runs", "2", "--no-such-flag"])
    assert why is not None and "unrecognized arguments: --no-such-flag" in why
    assert check_command(["python", "benchmarks/bench_pbs.py", "--runs", "2", "--daemon-runs", "1"]) is None
    assert check_command(["python", "benchmarks/bench_pbs.py", "--runs", "two"]) is not None  # a value of the wrong type


def _daemon_block() -> Block:
    """The first block that starts a daemon: :func:`test_daemon_example_runs_as_pasted` runs it and checks more."""
    return next(b for b in RUN if "malletrain daemon" in b.code)


def _short_blocks() -> list[Block]:
    """Every other block that runs (another page's daemon example too: it must stop its daemon itself)."""
    return [b for b in RUN if b != _daemon_block()]


@pytest.mark.slow
@pytest.mark.parametrize("block", _short_blocks(), ids=[b.id for b in _short_blocks()])
def test_short_block_runs(block: Block, short_tmp: Path) -> None:
    res, _, _ = run_block(block, short_tmp)
    assert res.returncode == 0, f"{block.where} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"


@pytest.mark.slow
def test_daemon_example_runs_as_pasted(short_tmp: Path) -> None:
    """Start the daemon, submit, wait until the job trains, status, nodes, cancel, stop: as written.

    The block uses ``.venv/bin/malletrain`` and runs with the system PATH, so
    ``command = ["python", ...]`` must reach the venv's interpreter by the
    interpreter rule, not through PATH. Its state folder is the one the block exports as
    ``MALLETRAIN_STATE_DIR`` (a folder of the run), else the default ``~/.malletrain``.
    """
    from malletrain.daemon.store import Store

    block = _daemon_block()
    res, clone, home = run_block(block, short_tmp)
    own = RUN_STATE_DIR.search(block.code)
    state = clone / own.group("folder") if own else home / ".malletrain"
    try:
        out = res.stdout + res.stderr
        daemon_log = (clone / "daemon.log").read_text() if (clone / "daemon.log").exists() else ""
        assert res.returncode == 0, f"{out[-4000:]}\ndaemon.log:\n{daemon_log[-3000:]}"
        assert "j000001: " in res.stdout and "JOBID" in res.stdout and "NODE" in res.stdout
        store = Store.open(state / "store.db")
        try:
            rec = store.require("j000001")
            states = [s for s, _, _ in store.history("j000001")]
        finally:
            store.close()
        assert rec.samples >= 1000 and "failed" not in states, (states, rec.message)
        assert rec.spec.command[0] == sys.executable or Path(rec.spec.command[0]).parent.resolve() == VENV_BIN.resolve()
        assert list((state / "logs").glob("j000001.*.log")), "the workers' logs"
        # private; a root daemon lets every user pass through (never list) to its control socket
        private = 0o711 if os.geteuid() == 0 else 0o700
        assert (state.stat().st_mode & 0o777) == private and ((state / "store.db").stat().st_mode & 0o777) == 0o600
    finally:
        leftovers = _wait_for_no_procs(str(short_tmp))
        for p in leftovers:
            p.kill()
    assert not leftovers, f"left running: {[p.cmdline() for p in leftovers]}"


def _wait_for_no_procs(text: str, timeout_s: float = 30.0) -> list:  # type: ignore[type-arg]
    """Processes still mentioning ``text`` once they had ``timeout_s`` to exit (agents exit after the daemon)."""
    from stepping import poll

    poll(lambda: not procs_mentioning(text), timeout_s, pause=0.5)
    return procs_mentioning(text)
