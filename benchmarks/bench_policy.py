"""The default policy's targets, one line each (PASS/FAIL), and what each part adds.

    .venv/bin/python benchmarks/bench_policy.py                      # 1 day, seeds 0-2, nas hpo stress
    .venv/bin/python benchmarks/bench_policy.py --days 7 --seeds 0,1,2,3,4 --no-parts --workers 2
    .venv/bin/python benchmarks/bench_policy.py --short   # the quick mode CI runs: 6 h, seed 0, nas, no parts

Every figure is measured in this run against a baseline measured in the same run, on the same
trace, workload and seeds (work = ``work_node_seconds``, the headline metric):

* default (``malletrain``) vs freetrain with its best and its worst realistic prior
  (``linear``, ``mean``, ``other``, ``noise:20``: the best/worst by mean work over the seeds);
* regret: ``(milp-true - malletrain) / milp-true`` (milp-true with the same admission);
* productive node-seconds / idle node-seconds with adaptive admission, and with fixed Pjmax 10;
* CPU and wall seconds of one replay of the whole trace with the default policy (``--week-seconds``),
  against the same replay with freetrain (no learning, no profiling: what the engine and the allocator
  cost alone), and both against the same replays of a baseline commit (``--baseline-commit``, default
  ``2d33a53``, the code before the replay's collector threshold and per-decision trims: the same
  decisions; ``30e0b54`` is the code before the kin rule, ``12b7530`` the one whose policy kept
  identity caches), timed in the same run, alternating, each in a fresh process (``--repeats N``: N
  times each, each side's fastest kept: a shared machine's speed drifts over minutes);
  ``--week-only`` prints just these, each with the load: the ratio to the baseline, and PASS when a
  baseline charging the same costs made the same decisions (work, decisions, solver calls);
  ``--baseline DIR`` names a checkout of the baseline, else one is made with ``git worktree add``
  and removed after. ``--calibration``
  names the costs the new side charges: ``measured`` (the shipped calibration, what ``simulate``
  charges by default) and/or ``free`` (none: the same work as the old code, which had no costs);
  the old side charges none either way;
* the parts one at a time, each added to the previous: jpa -> passive learning (no profiling)
  -> gated profiling -> adaptive admission (= the default) -> learned horizon (node valuation)
  (``--no-parts`` leaves them out: 7 replays per workload and seed instead of 11).

``--workers N`` runs the replays in N processes (each replay is single-threaded and deterministic,
so the figures do not depend on it; only the CPU seconds of ``--week-seconds`` are timed, alone).

``--short``: the first 6 hours, seed 0, the nas workload, no parts (7 replays); its PASS/FAIL lines are
the same checks on less, so a FAIL there says little about the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policy import PolicyConfig  # noqa: E402
from simulator import SimConfig, find_scaling, make_workload, simulate  # noqa: E402
from simulator.policies import PolicyContext, make_policy  # noqa: E402
from traces.data import find_data  # noqa: E402

from harness import add_short, last_line  # noqa: E402

TRACE = find_data("summit-2021-02-10_17.nodes.csv.gz")  # $MALLETRAIN_DATA, else the default
PRIORS = ("linear", "mean", "other", "noise:20")
BASE = PolicyConfig()
# the parts, each on top of the previous one (name, config of the "malletrain" preset's slot)
LADDER = (
    ("jpa (paper)", replace(BASE, profiling="always", admission="fixed", horizon="tfwd")),
    ("+ passive learning", replace(BASE, profiling="never", admission="fixed", horizon="tfwd")),
    ("+ gated profiling", replace(BASE, profiling="gated", admission="fixed", horizon="tfwd")),
    ("+ adaptive admission", replace(BASE, profiling="gated", admission="adaptive", horizon="tfwd")),
    ("+ node valuation", replace(BASE, profiling="gated", admission="adaptive", horizon="learned")),
)


def load(path: Path):  # type: ignore[no-untyped-def]
    import traces

    return traces.read(str(path))


_TIMELINE = None  # each worker process reads the trace once


def run(trace: Path, workload: str, seed: int, cfg: SimConfig, name: str, pcfg: PolicyConfig,
        prior: str = "mean") -> dict:
    global _TIMELINE
    if _TIMELINE is None:
        _TIMELINE = load(trace)
    scaling = find_scaling(None)
    wl = make_workload(workload, scaling, seed=seed)
    pol = make_policy(name, PolicyContext(wl.models, seed, prior), pcfg)
    return simulate(_TIMELINE, pol, workload, scaling=scaling, seed=seed, config=cfg).summary


def replays(with_parts: bool) -> list[tuple[str, str, PolicyConfig, str]]:
    """(label, policy name, config, freetrain prior) of one workload and seed."""
    out = [(f"freetrain:{p}", "freetrain", BASE, p) for p in PRIORS]
    out.append(("milp-true", "milp-true", BASE, "mean"))
    out.append(("fixed Pjmax 10", "malletrain", replace(BASE, admission="fixed"), "mean"))
    ladder = LADDER if with_parts else [(k, c) for k, c in LADDER if k == "+ adaptive admission"]
    out.extend((label, "malletrain", pc, "mean") for label, pc in ladder)
    return out


def pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b if b else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--days", type=float, default=1.0, help="replay window from the trace start (default 1)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workloads", default="nas,hpo,stress")
    ap.add_argument("--week-seconds", action="store_true", help="also time one whole-trace replay (default policy)")
    ap.add_argument("--week-only", action="store_true", help="only time the whole-trace replays (no targets)")
    ap.add_argument("--no-parts", action="store_true", help="leave out what each part adds (fewer replays)")
    ap.add_argument("--workers", type=int, default=1, help="replays in this many processes (default 1)")
    ap.add_argument("--baseline-commit", default=BASELINE_COMMIT,
                    help=f"the commit the week replay is timed against (default {BASELINE_COMMIT})")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of the baseline commit (default: made with git worktree add, removed after)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="time each week replay this many times, alternating the sides, and keep each side's fastest "
                         "(a shared machine's speed drifts over minutes; default 1)")
    ap.add_argument("--calibration", nargs="+", choices=CALIBRATIONS, default=list(CALIBRATIONS),
                    help="the costs the week replay charges on this checkout: measured (the shipped calibration, "
                         "simulate's default) and/or free (none, as the old code; identical work); default: both")
    add_short(ap, "the first 6 hours, seed 0, nas, no parts")
    args = ap.parse_args()
    if args.short:
        args.days, args.seeds, args.workloads, args.no_parts = 0.25, "0", "nas", True
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = args.workloads.split(",")
    if args.week_only:
        return 0 if week_seconds(args.trace, args.baseline, args.calibration, args.baseline_commit, args.repeats) else 1
    global _TIMELINE
    timeline = _TIMELINE = load(args.trace)  # forked workers inherit it
    cfg = SimConfig(start=timeline.start, end=min(timeline.end, timeline.start + args.days * 86400.0))
    print(f"trace {args.trace.name}, {args.days:g} day(s), seeds {seeds}, workloads {workloads}")
    results: dict[tuple[str, str], list[dict]] = {}
    plan = [(w, seed, label, name, pc, prior) for w in workloads for seed in seeds
            for label, name, pc, prior in replays(not args.no_parts)]
    with ProcessPoolExecutor(max_workers=args.workers) if args.workers > 1 else _InProcess() as pool:
        futures = [pool.submit(run, args.trace, w, seed, cfg, name, pc, prior) for w, seed, _, name, pc, prior in plan]
        done: dict[tuple[str, int], dict[str, dict]] = {}
        for (w, seed, label, *_), fut in zip(plan, futures):
            runs = done.setdefault((w, seed), {})
            runs[label] = fut.result()
            if len(runs) == len(plan) // (len(workloads) * len(seeds)):
                runs["malletrain"] = runs["+ adaptive admission"]  # the default config
                for k, s in runs.items():
                    results.setdefault((w, k), []).append(s)
                print(f"  {w} seed {seed}: " + ", ".join(f"{k} {s['work_node_seconds']:.4g}"
                                                        for k, s in runs.items()), flush=True)

    def mean_work(w: str, k: str) -> float:
        return statistics.mean(s["work_node_seconds"] for s in results[(w, k)])

    def mean_of(w: str, k: str, key: str) -> float:
        return statistics.mean(s[key] for s in results[(w, k)])

    ok_all = True

    def target(ok: bool, text: str) -> None:
        nonlocal ok_all
        ok_all &= ok
        print(f"{'PASS' if ok else 'FAIL'}  {text}")

    print()
    for w in workloads:
        ranked = sorted(PRIORS, key=lambda p: -mean_work(w, f"freetrain:{p}"))
        best, worst = ranked[0], ranked[-1]
        mt = mean_work(w, "malletrain")
        vs_best = pct(mt, mean_work(w, f"freetrain:{best}"))
        target(vs_best >= -1.0, f"{w}: default vs freetrain best prior ({best}): {vs_best:+.2f}% (>= -1%)")
        vs_worst = pct(mt, mean_work(w, f"freetrain:{worst}"))
        if w == "stress":
            target(vs_worst >= 5.0, f"{w}: default vs freetrain worst prior ({worst}): {vs_worst:+.2f}% (>= +5%)")
        else:
            print(f"info  {w}: default vs freetrain worst prior ({worst}): {vs_worst:+.2f}%")
        regret = statistics.mean(pct(s["work_node_seconds"], m["work_node_seconds"]) * -1
                                 for s, m in zip(results[(w, "malletrain")], results[(w, "milp-true")]))
        target(regret <= 2.0, f"{w}: regret vs milp-true {regret:.2f}% (<= 2%)")
        prod = mean_of(w, "malletrain", "productive_node_seconds") / mean_of(w, "malletrain", "idle_node_seconds")
        fixed = mean_of(w, "fixed Pjmax 10", "productive_node_seconds") / mean_of(w, "fixed Pjmax 10",
                                                                                  "idle_node_seconds")
        target(prod >= 0.85, f"{w}: productive / idle node-s {100 * prod:.1f}% adaptive (>= 85%); "
                             f"fixed Pjmax 10: {100 * fixed:.1f}%")
        if args.no_parts:
            continue
        steps = []
        prev = None
        for label, _ in LADDER:
            m = mean_work(w, label)
            steps.append(f"{label} {pct(m, prev):+.2f}%" if prev is not None else f"{label} {m:.4g}")
            prev = m
        print(f"parts {w}: " + " | ".join(steps))
    if args.week_seconds:
        ok_all &= week_seconds(args.trace, args.baseline, args.calibration, args.baseline_commit, args.repeats)
    last_line(f"{'all targets PASS' if ok_all else 'some targets FAIL'} ({args.days:g} day(s), seeds {seeds}, "
              f"workloads {', '.join(workloads)})")
    return 0 if ok_all else 1


BASELINE_COMMIT = "2d33a53"  # the code before the collector threshold and the per-decision trims (same decisions)
CALIBRATIONS = ("measured", "free")  # the costs the new side's week replay charges (the old side has none)
# One whole-trace replay (nas, seed 0) of the policy sys.argv[3], timed in CPU seconds (the trace read is
# not timed), run in a fresh interpreter on the checkout at sys.argv[1], charging the costs sys.argv[4]
# ("measured": the simulator's default; "free": none; "none": a checkout that predates costs); prints
# [cpu_s, work_node_seconds, decisions, solver_calls, wall_s].
TIME_WEEK = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import traces
from policy import PolicyConfig
from simulator import SimConfig, find_scaling, make_workload, simulate
from simulator.policies import PolicyContext, make_policy
costs = {}
if sys.argv[4] == "free":
    from simulator.calibration import free
    costs = {"calibration": free()}
tl = traces.read(sys.argv[2])
week = SimConfig(start=tl.start, end=tl.end, **costs)
t0, w0 = time.process_time(), time.perf_counter()
scaling = find_scaling(None)
wl = make_workload("nas", scaling, seed=0)
pol = make_policy(sys.argv[3], PolicyContext(wl.models, 0, "mean"), PolicyConfig())
summary = simulate(tl, pol, "nas", scaling=scaling, seed=0, config=week).summary
print(json.dumps([time.process_time() - t0, summary["work_node_seconds"], summary["decisions"],
                  summary["solver_calls"], time.perf_counter() - w0]))
"""


def time_week(checkout: Path, trace: Path, policy: str, costs: str) -> list[float]:
    """:data:`TIME_WEEK` of ``policy`` on ``checkout`` charging ``costs``, in a fresh process, with the
    load (1-minute average) when it ended appended."""
    res = subprocess.run([sys.executable, "-c", TIME_WEEK, str(checkout), str(trace), policy, costs],
                         capture_output=True, text=True, timeout=1800,
                         env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"})
    if res.returncode != 0:
        raise RuntimeError(f"week replay on {checkout} failed ({res.returncode}): {res.stderr[-2000:]}")
    return [*json.loads(res.stdout.strip().splitlines()[-1]), os.getloadavg()[0]]


def week_seconds(trace: Path, baseline: Path | None, calibrations: list[str], commit: str = BASELINE_COMMIT,
                 repeats: int = 1) -> bool:
    """Time one whole-trace replay (nas, seed 0) with the default policy and with freetrain, on this
    checkout under each of ``calibrations`` and on ``commit``'s (its default costs), in the same run;
    print each against the old one. False when a baseline that did the same work decided otherwise."""
    with tempfile.TemporaryDirectory(prefix="bench-policy-base-") as tmp:
        made = baseline is None
        old_tree = Path(tmp) / "base" if made else baseline
        if made:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), commit],
                           check=True, capture_output=True, timeout=120)
        try:  # interleaved, so that both sides of a ratio see the same machine (a shared one varies)
            new: dict[tuple[str, str], list[float]] = {}
            old: dict[str, list[float]] = {}
            for _ in range(max(1, repeats)):  # each side's fastest run (by wall seconds) is kept
                for name in ("freetrain", "malletrain"):
                    for costs in calibrations:
                        new[(name, costs)] = _faster(new.get((name, costs)), time_week(ROOT, trace, name, costs))
                    old[name] = _faster(old.get(name), time_week(old_tree, trace, name, "none"))
        finally:
            if made:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)],
                               capture_output=True, timeout=120)
    ok = True
    for costs in calibrations:
        mine, base = new[("malletrain", costs)], old["malletrain"]
        same = mine[1:4] == base[1:4]
        ok &= same or mine[1] != base[1]
        terms = "the same decisions" if same else "not the same work or decisions"
        print(f"{'PASS' if same else 'info'}  week replay (nas, seed 0), default policy, costs {costs}: "
              f"{_timed(mine)}; baseline {commit} (same run, {terms}): {_timed(base)} "
              f"({mine[0] / base[0]:.2f}x CPU, {mine[4] / base[4]:.2f}x wall)")
        ft, ft_base = new[("freetrain", costs)], old["freetrain"]
        print(f"info  freetrain (no learning, no profiling), costs {costs}: {_timed(ft)}; before: "
              f"{_timed(ft_base)} ({ft[0] / ft_base[0]:.2f}x CPU)")
    for (name, costs), res in new.items():
        print(f"info  {name}, costs {costs}: work node-seconds {res[1]:.6g}, decisions {res[2]}, solver calls "
              f"{res[3]} (baseline {commit}, its default costs: {old[name][1]:.6g}, {old[name][2]}, {old[name][3]})")
    return ok


def _faster(kept: list[float] | None, res: list[float]) -> list[float]:
    """The faster of two timings of one replay (:func:`time_week`; its work and decisions are the same)."""
    return res if kept is None or res[4] < kept[4] else kept


def _timed(res: list[float]) -> str:
    """A week replay's CPU and wall seconds and the load when it ended (:func:`time_week`)."""
    return f"{res[0]:.1f} CPU s, {res[4]:.1f} s wall (load {res[5]:.1f})"


class _InProcess:
    """A stand-in for the process pool with ``--workers 1``: every replay runs here, in order."""

    def __enter__(self) -> "_InProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn, *args):  # type: ignore[no-untyped-def]
        from concurrent.futures import Future

        fut: Future = Future()
        fut.set_result(fn(*args))
        return fut


if __name__ == "__main__":
    raise SystemExit(main())
