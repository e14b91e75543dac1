"""Every benchmark the README or a docs page cites runs to its last line.

Each script the README or docs/*.md cite is in one of two tables: :data:`QUICK`, whose quick mode
runs here to its last line (marked ``slow``, or ``slurm``/``pbs`` where it starts that cluster:
CI runs them all, so a change that breaks a cited benchmark is seen there), or :data:`NOT_RUN`,
with why not (what makes it expensive). A script another one starts (a part of it) is named on the
pages as that script's part, never cited as a command of its own.
:func:`test_every_cited_benchmark_is_in_a_table` (fast) makes a new citation choose, and keeps no table
entry the pages no longer cite. A quick mode is
``--short`` where a script has no older one (``benchmarks/harness.py``'s ``add_short``); one that reads
the real data skips without it, naming the files (fails under ``MALLETRAIN_REQUIRE_DATA=1``, as CI runs).

A run passes when the script exits and its last line is the one it promises; not when its figure
meets a target (the machine's load decides that, and the figure is the script's to print).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITED = re.compile(r"benchmarks/[A-Za-z0-9_/]+\.py")
RUN_TIMEOUT_S = 900
SUMMIT = "summit-2021-02-10_17.nodes.csv.gz"
PHILLY = ("philly-jobs.csv.gz", "pollux")


@dataclass(frozen=True)
class Quick:
    script: str
    args: tuple[str, ...]
    """Its arguments; ``{data}`` in one is the real data's folder (:data:`conftest.SHARED_DATA`)."""
    last_line: str
    """A regular expression the script's last non-empty line matches from its start."""
    also: tuple[str, ...] = ()
    """Regular expressions other lines must match from their start (a script whose last line is a part's)."""
    marks: tuple[pytest.MarkDecorator, ...] = field(default=(pytest.mark.slow,))
    needs: str | None = None
    """A module the run needs (an extra CI installs): skipped without it."""
    pbs: bool = False
    """It starts the PBS test cluster: skipped where OpenPBS is not installed, unless MALLETRAIN_REQUIRE_PBS=1."""
    slurm: bool = False
    """It starts the Slurm test cluster: skipped where Slurm is not installed, unless MALLETRAIN_REQUIRE_SLURM=1."""
    data: tuple[str, ...] = ()
    """The files (or folders) of the real data it reads: skipped without them (:func:`conftest.missing_data`)."""


QUICK = (
    Quick("bench_daemon_scale.py", ("--parse-only",), r"parse: 10624 nodes: sinfo "),
    Quick("bench_allocator.py", ("--quick",), r"  #\d+ "),
    Quick("bench_sigterm_exit.py", ("--reps", "1"), r"SIGTERM x2 -> worker exit: median "),
    Quick("bench_daemon_start.py", ("--reps", "1"), r"agent_dead_after default "),
    Quick("bench_monitor.py", ("--reports", "5000"), r"target >= [\d,]+ authenticated reports/s with zero loss"),
    Quick("bench_fairness.py", ("--short",), r"fairness: late user's first node after "),
    Quick("bench_rescale.py", ("--reps", "1"), r"(all within target|SOME ABOVE TARGET)$"),
    Quick("bench_node_workers.py", (), r"node workers: K=2 on 3 nodes, "),
    # the agents wait out a restart slower than the default --dead-after 10 (a loaded machine): at load 21
    # with 10 they had stopped the job's workers, and the republished generation never came
    Quick("bench_daemon_restart.py", ("--reps", "1", "--dead-after", "30"), r"\s*processes left behind "),
    Quick("bench_launchers.py", ("--short",), r"launchers: torchrun script warm ", needs="lightning"),
    Quick("bench_pbs.py", ("--short",), r"node back -> first step on it: median .* over 1 runs \[load ",
          marks=(pytest.mark.pbs,), pbs=True),
    # its own figures, then bench_restart_stall.py's quick mode on Slurm (its last line)
    Quick("bench_slurm.py", ("--short",), r"committed steps lost: \d+; samples counted twice: \d+ \[load ",
          also=(r"node back -> first step on it: median .*x the baseline's median",
                r"main-queue delay \(paired with a run without the daemon\): median "),
          marks=(pytest.mark.slurm,), slurm=True),
    # written to a temporary file: the checkout's simulator/calibration.json stays as it is
    Quick("calibrate.py", ("--short",), r"calibration: 7 values \(1 round\(s\)\) written to ",
          marks=(pytest.mark.slurm,), slurm=True),
    # a window with two prod jobs on two nodes (of the cited windows' first day)
    Quick("bench_real_replay.py", ("--short", "--trace", f"{{data}}/{SUMMIT}", "--start", "367200"),
          r"real replay: prod delay median .*simulator predicts ", marks=(pytest.mark.slurm,), slurm=True,
          data=(SUMMIT,)),
    Quick("bench_horovod.py", ("--short",), r"scale down \(n=1\): pause median ", needs="horovod.torch"),
    Quick("attacks/store_faults.py", (), r"store attacks: 6 tried, 0 accepted "),
    Quick("bench_checkpoint.py", ("--short",), r"checkpoint: 1 model\(s\), 1 repetition\(s\): save / raw write median "),
    # this checkout against itself: the path to the last line, and one replay that must come out the same twice
    Quick("bench_core_same.py", ("--short", "--baseline", "."), r"all replays SAME \(1 replay", data=(SUMMIT,)),
    Quick("bench_costs.py", ("--short",), r"warm starts \(.* add -?[\d.]+% to the work", data=(SUMMIT, *PHILLY)),
    Quick("bench_cuda_resume.py", ("--device", "cpu", "--short"), r"cpu resume: PASS: "),
    # a 20 s run says little about the ordering: PASS or FAIL, the path ran to its verdict
    Quick("bench_demo_policies.py", ("--short",), r"(PASS|FAIL)  default vs jpa in work, real training: "),
    Quick("bench_learning.py", ("--short",), r"freetrain:linear +work [\d.e+]+ node-s +vs milp-true ",
          data=(SUMMIT, *PHILLY)),
    # this tree against itself as the baseline: the comparison's path, not a figure
    Quick("bench_loop_step.py", ("--short", "--baseline", "."), r"step: 512 nodes: idle iteration "),
    Quick("bench_policy.py", ("--short",), r"(all targets PASS|some targets FAIL) \(0.25 day", data=(SUMMIT,)),
    Quick("bench_profiler.py", ("--short",), r"profiler: both estimators ingest ", data=("summit-scaling.csv",)),
    Quick("bench_simulator.py", ("--short",), r"slowest replay of 1 day\(s\) ", data=(SUMMIT,)),
    # the local backend: the same kills, restarts and adoptions as on Slurm, without its test cluster
    Quick("bench_restart_stall.py", ("--backend", "local", "--short"),
          r"committed steps lost: \d+; samples counted twice: \d+"),
    # as root, as bench_fairness.py: the spoofing sends another user's requests as nobody
    Quick("attacks/bench_faults.py", ("--short",), r"faults: \d+ kills, \d+ lost, \d+ duplicated, "),
    Quick("bench_sweep.py", ("--short",), r"sweep: 4 trials, recalls \d+, ", needs="optuna"),
    Quick("bench_traces.py", ("--short",), r"traces: read the Summit week in ", data=(SUMMIT,)),
)

NOT_RUN = {
    "bench_first_command.py": "clones the committed checkout, installs it into a fresh venv and runs the README's "
                              "first command, its demo included: about 3.5 minutes idle, and pip's cache or a network",
}


def cited() -> set[str]:
    """The scripts under benchmarks/ the README and the docs pages name (paths below benchmarks/)."""
    return {m[len("benchmarks/"):] for page in PAGES for m in CITED.findall(page.read_text())}


def test_every_cited_benchmark_is_in_a_table() -> None:
    quick = {q.script for q in QUICK}
    assert not quick & set(NOT_RUN), "a script in both tables"
    missing = sorted(cited() - quick - set(NOT_RUN))
    assert not missing, f"cited but in neither QUICK nor NOT_RUN (say how CI runs it, or why not): {missing}"
    gone = sorted(s for s in quick | set(NOT_RUN) if not (ROOT / "benchmarks" / s).is_file())
    assert not gone, f"in a table but not under benchmarks/: {gone}"
    stale = sorted(set(NOT_RUN) - cited())
    assert not stale, f"in NOT_RUN but no page cites it (drop it, or cite it where it is a command): {stale}"


def test_the_quick_mode_and_the_last_line_come_from_the_harness() -> None:
    """One ``--short`` and one way to print a last line: a script takes ``--short`` from
    ``benchmarks/harness.py`` (``add_short``), never parses it itself, and one that does prints its last line
    through the harness (``last_line``: the figure, then the load); a quick run given ``--short`` has it."""
    own, silent = [], []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        if path.name == "harness.py":
            continue
        text = path.read_text()
        name = path.relative_to(ROOT / "benchmarks").as_posix()
        if re.search(r"""add_argument\(\s*["']--short["']""", text):
            own.append(name)
        if "add_short(" in text and "last_line(" not in text:
            silent.append(name)
    assert not own, f"parse --short with harness.add_short, not add_argument: {own}"
    assert not silent, f"take --short from the harness but print the last line another way (use last_line): {silent}"
    without = [q.script for q in QUICK if "--short" in q.args
               and "add_short(" not in (ROOT / "benchmarks" / q.script).read_text()]
    assert not without, f"run with --short but do not take it from the harness: {without}"


@pytest.mark.parametrize("q", [pytest.param(q, id=q.script, marks=q.marks) for q in QUICK])
def test_the_cited_benchmark_runs_to_its_last_line(q: Quick) -> None:
    if q.needs is not None:
        pytest.importorskip(q.needs)
    if q.pbs:
        from tests.clusters.pbs_cluster import installed

        if not installed() and os.environ.get("MALLETRAIN_REQUIRE_PBS") != "1":
            pytest.skip("OpenPBS is not installed (python -m tests.clusters.pbs_cluster install)")
    if q.slurm and shutil.which("slurmctld") is None:
        if os.environ.get("MALLETRAIN_REQUIRE_SLURM") == "1":
            pytest.fail("MALLETRAIN_REQUIRE_SLURM=1 but Slurm is not installed")
        pytest.skip("Slurm is not installed (python -m tests.clusters.slurm_cluster install)")
    missing = [name for name in q.data if not (conftest.SHARED_DATA / name).exists()]
    if missing:
        conftest.missing_data(missing)
    data = {"MALLETRAIN_DATA": str(conftest.SHARED_DATA)} if q.data else {}
    args = [arg.format(data=conftest.SHARED_DATA) for arg in q.args]
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / q.script), *args], cwd=ROOT,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                         env={**os.environ, "PYTHONUNBUFFERED": "1", **data})
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    absent = [pattern for pattern in q.also if not any(re.match(pattern, line) for line in lines)]
    assert not absent, f"{q.script} {' '.join(args)} printed no line matching {absent}; stdout ends {res.stdout[-1500:]!r}"
    assert re.match(q.last_line, last), (
        f"{q.script} {' '.join(args)} exited {res.returncode}; its last line {last!r} is not {q.last_line!r}; "
        f"stdout ends {res.stdout[-1500:]!r}; stderr ends {res.stderr[-1500:]!r}")
