"""Every benchmark the README or a docs page cites runs to its last line.

Each script the README or docs/*.md cite is in one of two tables: :data:`QUICK`, whose quick mode
runs here to its last line (marked ``slow``, or ``slurm``/``pbs`` where it starts that cluster:
CI runs them all, so a change that breaks a cited benchmark is seen there), or :data:`NOT_RUN`,
with why not (a GPU, hours, a baseline checkout, or a part another script runs).
:func:`test_every_cited_benchmark_is_in_a_table` (fast) makes a new citation choose.

A run passes when the script exits and its last line is the one it promises; not when its figure
meets a target (the machine's load decides that, and the figure is the script's to print).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITED = re.compile(r"benchmarks/[A-Za-z0-9_/]+\.py")
RUN_TIMEOUT_S = 900


@dataclass(frozen=True)
class Quick:
    script: str
    args: tuple[str, ...]
    last_line: str
    """A regular expression the script's last non-empty line matches from its start."""
    marks: tuple[pytest.MarkDecorator, ...] = field(default=(pytest.mark.slow,))
    needs: str | None = None
    """A module the run needs (an extra CI installs): skipped without it."""
    pbs: bool = False
    """It starts the PBS test cluster: skipped where OpenPBS is not installed, unless MALLETRAIN_REQUIRE_PBS=1."""


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
    Quick("bench_pbs.py", ("--runs", "1", "--daemon-runs", "1"), r"node back -> first step on it: median ",
          marks=(pytest.mark.pbs,), pbs=True),
)

NOT_RUN = {
    "bench_checkpoint.py": "state dicts of real models' sizes (ResNet-50, BERT-base): minutes of CPU a run",
    "bench_core_same.py": "six one-day replays, each in this checkout and in a baseline commit's",
    "bench_costs.py": "five seeds of an hour of the Philly stream on 64 nodes: tens of minutes",
    "bench_cuda_resume.py": "needs a GPU",
    "bench_demo_policies.py": "three 150 s runs of real training per policy: 16 minutes at least",
    "attacks/bench_faults.py": "its parts run against real root daemons for about half an hour; "
                       "tests/test_claims.py and the security tests check what it attacks",
    "bench_first_command.py": "clones the checkout and installs it into a fresh venv (minutes)",
    "bench_horovod.py": "needs Elastic Horovod (built by .ci/build-horovod.sh); tests/test_horovod_*.py run it",
    "bench_learning.py": "day-long windows of the dev week for five seeds",
    "bench_loop_step.py": "compares this tree with a baseline tree (--baseline DIR) on a whole machine",
    "bench_policy.py": "replays days of the Summit week for several seeds and workloads",
    "bench_profiler.py": "the scalability-model error over the whole Summit curve set",
    "bench_real_replay.py": "half an hour of a real node-state log on the Slurm test cluster",
    "bench_restart_stall.py": "repeated daemon kill -9s on the Slurm test cluster (minutes)",
    "bench_simulator.py": "whole-week replays of the Summit log",
    "bench_slurm.py": "its pilots' and the daemon's runs on the Slurm test cluster take tens of minutes; "
                      "the slurm-marked tests run the same cluster",
    "bench_sweep.py": "twelve trials each way, even with --short (minutes each way)",
    "bench_traces.py": "reads every real log of the data directory, best of several",
    "calibrate.py": "measures on the Slurm test cluster and writes simulator/calibration.json",
    "attacks/faults_shares.py": "a part of bench_faults.py (--parts shares), not a script of its own",
    "scale/daemon_proc.py": "the daemon process bench_daemon_scale.py starts, not a script of its own",
    "scale/load.py": "the simulated agents bench_daemon_scale.py starts, not a script of its own",
    "attacks/store_faults.py": "a part of bench_faults.py (--parts round2), not a script of its own",
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


@pytest.mark.parametrize("q", [pytest.param(q, id=q.script, marks=q.marks) for q in QUICK])
def test_the_cited_benchmark_runs_to_its_last_line(q: Quick) -> None:
    if q.needs is not None:
        pytest.importorskip(q.needs)
    if q.pbs:
        from testclusters.pbs_cluster import installed

        if not installed() and os.environ.get("MALLETRAIN_REQUIRE_PBS") != "1":
            pytest.skip("OpenPBS is not installed (python -m testclusters.pbs_cluster install)")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / q.script), *q.args], cwd=ROOT,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    assert re.match(q.last_line, last), (
        f"{q.script} {' '.join(q.args)} exited {res.returncode}; its last line {last!r} is not {q.last_line!r}; "
        f"stdout ends {res.stdout[-1500:]!r}; stderr ends {res.stderr[-1500:]!r}")
