"""Issue H's targets for the default policy, one line each (PASS/FAIL), and what each part adds.

    .venv/bin/python benchmarks/bench_policy.py                      # 1 day, seeds 0-2, nas hpo stress
    .venv/bin/python benchmarks/bench_policy.py --days 7 --seeds 0,1,2,3,4 --no-parts --workers 2

Every figure is measured in this run against a baseline measured in the same run, on the same
trace, workload and seeds (work = ``work_node_seconds``, G's headline metric):

* default (``malletrain``) vs freetrain with its best and its worst realistic prior
  (``linear``, ``mean``, ``other``, ``noise:20``: the best/worst by mean work over the seeds);
* regret: ``(milp-true - malletrain) / milp-true`` (milp-true with the same admission);
* productive node-seconds / idle node-seconds with adaptive admission, and with fixed Pjmax 10;
* CPU seconds of one replay of the whole trace with the default policy (``--week-seconds``), against
  the same replay with freetrain (no learning, no profiling: what the engine and the allocator cost
  alone) timed in the same run; ``--week-only`` prints just these two;
* the parts one at a time, each added to the previous: jpa -> passive learning (no profiling)
  -> gated profiling -> adaptive admission (= the default) -> learned horizon (node valuation)
  (``--no-parts`` leaves them out: 7 replays per workload and seed instead of 11).

``--workers N`` runs the replays in N processes (each replay is single-threaded and deterministic,
so the figures do not depend on it; only the CPU seconds of ``--week-seconds`` are timed, alone).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policy import PolicyConfig  # noqa: E402
from simulator import SimConfig, find_scaling, make_workload, simulate  # noqa: E402
from simulator.policies import PolicyContext, make_policy  # noqa: E402

TRACE = Path("/work/shared/data/summit-2021-02-10_17.nodes.csv.gz")
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
    args = ap.parse_args()
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = args.workloads.split(",")
    global _TIMELINE
    timeline = _TIMELINE = load(args.trace)  # forked workers inherit it
    cfg = SimConfig(start=timeline.start, end=min(timeline.end, timeline.start + args.days * 86400.0))
    if args.week_only:
        return 0 if week_seconds(args.trace, timeline) else 1
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
        ok_all &= week_seconds(args.trace, timeline)
    print("all targets PASS" if ok_all else "some targets FAIL")
    return 0 if ok_all else 1


def week_seconds(trace: Path, timeline) -> bool:  # type: ignore[no-untyped-def]
    """Time one whole-trace replay (nas, seed 0) with the default policy and with freetrain; print both."""
    week = SimConfig(start=timeline.start, end=timeline.end)
    cpu = {}
    for name in ("freetrain", "malletrain"):
        t0 = time.process_time()
        run(trace, "nas", 0, week, name, BASE)
        cpu[name] = time.process_time() - t0
    ok = cpu["malletrain"] <= 15.0
    print(f"{'PASS' if ok else 'FAIL'}  week replay (nas, seed 0), default policy: {cpu['malletrain']:.1f} CPU s "
          f"(<= 15 s); freetrain (baseline, same run): {cpu['freetrain']:.1f} CPU s "
          f"({cpu['malletrain'] / cpu['freetrain']:.2f}x)")
    return ok


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
