"""Crashes, recalls, fuzz and forgeries against real daemons; prints a table and one summary line.

    python benchmarks/attacks/bench_faults.py [--kills 20] [--recalls 100] [--fuzz 3000] [--seed 1] [--short]
    python benchmarks/attacks/bench_faults.py --short   # the quick mode CI runs: spoof, fuzz (20 a kind)

Every part runs the real thing (``malletrain daemon`` subprocesses, local backend,
real agents and workers) on a private state dir, and counts what is lost, duplicated or accepted that should not be:

* **kills**: a toy-runtime daemon on 4 nodes whose idleness flips (a written
  nodes-csv trace), a mix of jobs (with targets, without, profiled), submits and
  cancels through the CLI before and after each of ``--kills`` random
  ``kill -9``s, some while the daemon is down. Lost: a submitted job missing from
  the store, or one neither cancelled nor completed at the end. Duplicated: a job
  id or name twice in the store, or two live workers of one job on one node.
  Progress going backwards between two looks is counted as lost too.
* **restarts** of every job kind with real PyTorch workers: running (its workers
  adopted after ``kill -9``, fresh workers after a clean stop), profiling, queued,
  and suspended when the trace's recall catches the job on its node (the states
  before each restart are printed; ``tests/test_restarts.py`` makes the suspended
  case deterministic); each restarted after SIGTERM and after ``kill -9``. Lost: a
  job that does not train again after its restarts.
* **recalls**: ``--recalls`` node recalls from a trace during real PyTorch
  training of two elastic jobs. Lost: a job that fails or stops training.
* **fuzz**: ``--fuzz`` mutated inputs per kind (trace files of each format, job
  files, daemon configs, monitor frames, control requests to a live daemon).
  Tracebacks: any exception but the input's own error type, a hang (5 s), a
  traceback in a daemon or agent log, or a daemon that stops answering.
* **spoofing**: forged reports (unsigned, wrong key, another job's key, replayed,
  oversize values, unknown job), control requests from another local user
  (cancel of someone else's job, shutdown, a submit claiming another owner).
  Accepted: any of them that changed anything.

Orphans: processes that mention a state dir after its daemon stopped.
* **round2** (``benchmarks/attacks/faults_round2.py``): another user's jobs probing
  the privilege drop (environment, cwd, a ``setsid()`` grandchild, an ownerless job,
  a log flood), self-signed reports claiming more than a node can train, ~1,000
  idle connections from one user to each port, and the rendezvous store's attacks.

* **shares** (``benchmarks/attacks/faults_shares.py``): a job's values the daemon reads (a generation of
  2^63, a 5M-chunk checkpoint header, a 4,300-digit counter: the daemon must stay up, also after a
  restart), a local user's silent connections to the rendezvous store (another user's job must still
  reach it), a job claiming a world it was not given at rates it never trained (its neighbour must
  keep its node), and a log flood on a 300 MiB state file system (the disk must not fill).
* **curves**, **keys**, **stopcodes** (``benchmarks/attacks/faults_claims.py``): a declared curve of
  ``{1: 1, 2: 10^6}`` against a victim on both nodes (``--curve-seconds`` long), a torchrun job's
  ready key inflated to 10^6 and 200,000 local ranks before a ``kill -9``, and jobs that exit 143,
  137, 130, 129 or 75 by themselves (they must fail, ``max_failures = 3``).
* **neighbours** (``--neighbours 2``): two more daemons, each with its own state dir, ports and
  agents, run a job of their own for the whole run; a job of theirs that stops training or loses a
  worker counts as lost (one installation's agents must not sweep another's cgroups).

The fuzz, spoofing, round2, shares and claims parts live in ``faults_fuzz.py``, ``faults_spoof.py``,
``faults_round2.py``, ``faults_shares.py`` and ``faults_claims.py`` beside this file.

Orphans: processes that mention a state dir after its daemon stopped.
Goals: lost = duplicated = orphans = tracebacks = accepted = escaped = down = 0. The last line is
``faults: K kills, L lost, D duplicated, R recalls, O orphans, F fuzz cases, T tracebacks,
S spoofed reports, A accepted, R store attacks, RA accepted, P privilege probes, PA escaped,
D fd floods, DD daemon down, J job-crash attempts, JD daemon down, L lockouts, LV victims delayed,
E evictions, EV victims evicted, G log floods, GF disk full, C curve lies, D nodes taken, E key
inflations, F daemon stalls, G stop-code loops, H never failed``; every "down", "delayed",
"evicted", "full", "taken", "stalls" and "never failed" count is a goal of 0. ``--short``: the spoofing and
20 fuzz cases a kind, without neighbours (two minutes on a loaded 2-core machine; the
goals of the parts left out hold trivially there, so a short run's "goals met" is not the suite's).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import psutil
from faults_common import (
    TORCH_CONFIG,
    TORCH_JOB,
    TOY_CONFIG,
    TOY_JOB,
    Daemon,
    Tally,
    flip_trace,
    stop_and_count,
    trains,
    wait,
    workdir,
)
from harness import add_short, last_line  # beside faults_common, which puts benchmarks/ on sys.path

from malletrain.cli.procs import procs_mentioning


def part_kills(t: Tally, kills: int, rng: random.Random) -> None:
    print(f"kills: {kills} kill -9s of a toy daemon with submits and cancels around them", flush=True)
    with workdir("mt-faults-kills-") as top:
        trace = top / "trace.csv"
        flip_trace(trace, 4, 3 * kills, 4.0 * kills, rng)
        d = Daemon(top, TOY_CONFIG.format(trace=trace))
        d.start()
        submitted: dict[str, str] = {}  # id -> name
        cancelled: set[str] = set()
        seen: dict[str, int] = {}
        n = 0

        def submit_some(k: int) -> None:
            nonlocal n
            for _ in range(k):
                n += 1
                lo = rng.choice((1, 1, 2))
                text = TOY_JOB.format(name=f"job{n}", rate=rng.choice((1000, 4000)), lo=lo, hi=rng.choice((lo, 4)),
                                      profile=rng.choice(("false", "false", "true")),
                                      samples=f"samples = {rng.choice((5000, 20000, 60000))}")
                submitted[d.submit(text, f"job{n}")] = f"job{n}"

        def look() -> None:
            for jid, j in d.jobs().items():
                if j["samples"] < seen.get(jid, 0):
                    t.lost += 1
                    t.note(f"{jid}: stored progress went back from {seen[jid]} to {j['samples']}")
                seen[jid] = max(seen.get(jid, 0), j["samples"])

        submit_some(4)
        for k in range(kills):
            time.sleep(rng.uniform(0.5, 3.0))
            submit_some(rng.randint(0, 2))
            live = [j for j in submitted if j not in cancelled]
            if live and rng.random() < 0.3:
                victim = rng.choice(live)
                d.cancel(victim)
                cancelled.add(victim)
            look()
            d.kill9()
            t.kills += 1
            if rng.random() < 0.5:  # submit and cancel while the daemon is down (straight into the store)
                submit_some(1)
                if rng.random() < 0.5:
                    victim = rng.choice(list(submitted))
                    d.cancel(victim)
                    cancelled.add(victim)
            time.sleep(rng.uniform(0.0, 2.0))
            d.start()
            look()
            dup = duplicate_workers(d.state)
            if dup:
                t.duplicated += dup
                t.note(f"after kill {k + 1}: {dup} job(s) with two live workers on one node")
        done = wait(lambda: all(j["state"] in ("completed", "cancelled") for j in d.jobs().values()), 300, 1.0)
        jobs = d.jobs()
        look()
        stop_and_count(d, t)
        names = [j["name"] for j in jobs.values()]
        t.duplicated += len(names) - len(set(names)) + len(set(jobs) - set(submitted))
        missing = set(submitted) - set(jobs)
        unfinished = [jid for jid, j in jobs.items() if j["state"] not in ("completed", "cancelled")]
        t.lost += len(missing) + len(unfinished)
        for jid in missing:
            t.note(f"{jid} ({submitted[jid]}) is missing from the store")
        for jid in unfinished:
            t.note(f"{jid} ended the run {jobs[jid]['state']} ({jobs[jid]['message']})")
        print(f"  {len(submitted)} jobs, {len(cancelled)} cancels, "
              f"{sum(j['state'] == 'completed' for j in jobs.values())} completed, "
              f"{'all ended' if done else 'NOT all ended'}", flush=True)


def duplicate_workers(state: Path) -> int:
    """Jobs that have two live toy workers on one node (a restart that started a second copy)."""
    count: dict[tuple[str, str], int] = {}
    for p in procs_mentioning(str(state)):
        try:
            env = p.environ()
        except psutil.Error:
            continue
        job, worker = env.get("MALLETRAIN_JOB"), env.get("MALLETRAIN_WORKER", "")
        node = worker.split(".")[1] if worker.count(".") >= 1 else None
        if job and node and "malletrain.worker.toy" in " ".join(p.cmdline()):
            count[(job, node)] = count.get((job, node), 0) + 1
    return sum(1 for c in count.values() if c > 1)


# ---------------------------------------------------------------- restarts and recalls (PyTorch)
def part_restarts(t: Tally) -> None:
    print("restarts: every job kind through SIGTERM and kill -9 restarts, real PyTorch workers", flush=True)
    with workdir("mt-faults-restarts-") as top:
        # node n03 is recalled at +40 s and stays busy: the job on it is suspended
        trace = top / "trace.csv"
        t0 = 1_700_000_000
        rows = [f"{t0},n{i:02d},1" for i in range(4)] + [f"{t0 + 40},n03,0"]
        trace.write_text("time,node,idle\n" + "\n".join(rows) + "\n")
        d = Daemon(top, TORCH_CONFIG.format(nodes=4, trace=trace, max_running=3))
        d.start()
        kinds = {
            "running": d.submit(TORCH_JOB.format(name="running", lo=1, hi=2, profile="false"), "running"),
            "profiling": d.submit(TORCH_JOB.format(name="profiling", lo=1, hi=1, profile="true"), "profiling"),
        }
        if not wait(lambda: all(d.jobs()[j]["samples"] > 0 for j in kinds.values()), 240, 1.0):
            t.note("restarts: the first jobs never trained")
        kinds["suspended"] = d.submit(TORCH_JOB.format(name="suspended", lo=1, hi=1, profile="false"), "suspended")
        kinds["queued"] = d.submit(TORCH_JOB.format(name="queued", lo=1, hi=1, profile="false"), "queued")
        wait(lambda: d.jobs()[kinds["suspended"]]["state"] == "suspended", 120, 1.0)
        for how in ("SIGTERM", "kill -9"):
            states = {k: d.jobs()[j]["state"] for k, j in kinds.items()}
            print(f"  before {how}: {states}", flush=True)
            if how == "SIGTERM":
                t.tracebacks += d.stop() != 0
            else:
                d.kill9()
                t.kills += 1
            time.sleep(1.0)
            d.start()
            for kind in ("running", "profiling"):
                if not trains(d, kinds[kind], 240):
                    t.lost += 1
                    t.note(f"restarts: the {kind} job did not train after the {how} restart")
        # the queued job waits for Pjmax; the suspended one for its node: cancel a runner, both must go
        d.cancel(kinds["running"])
        for kind in ("suspended", "queued"):
            ok = wait(lambda k=kind: d.jobs()[kinds[k]]["samples"] > 0, 240, 1.0)
            if not ok:
                t.lost += 1
                t.note(f"restarts: the {kind} job never trained after the restarts")
        stop_and_count(d, t)


def part_recalls(t: Tally, recalls: int, rng: random.Random) -> None:
    print(f"recalls: {recalls} node recalls during real PyTorch training of two elastic jobs", flush=True)
    with workdir("mt-faults-recalls-") as top:
        trace = top / "trace.csv"
        span = 2.5 * recalls
        made = flip_trace(trace, 4, 2 * recalls, span, rng, min_idle=1)
        d = Daemon(top, TORCH_CONFIG.format(nodes=4, trace=trace, max_running=2))
        d.start()
        jobs = [d.submit(TORCH_JOB.format(name=f"elastic{i}", lo=1, hi=4, profile="false"), f"elastic{i}")
                for i in range(2)]
        time.sleep(span + 5)
        t.recalls += made
        for jid in jobs:
            j = d.jobs()[jid]
            if j["state"] in ("failed", "cancelled", "completed"):
                t.lost += 1
                t.note(f"recalls: {jid} ended {j['state']}: {j['message']}")
            elif not trains(d, jid, 120):
                t.lost += 1
                t.note(f"recalls: {jid} does not train after the recalls ({j['state']})")
        print(f"  samples: {[d.jobs()[j]['samples'] for j in jobs]}", flush=True)
        stop_and_count(d, t)


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--recalls", type=int, default=100)
    ap.add_argument("--fuzz", type=int, default=3000, help="mutated inputs per kind")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--parts", default="spoof,round2,shares,curves,keys,stopcodes,fuzz,kills,restarts,recalls",
                    help="comma-separated subset of spoof,round2,shares,curves,keys,stopcodes,fuzz,kills,restarts,"
                         "recalls")
    ap.add_argument("--curve-seconds", type=float, default=60.0,
                    help="how long the curves part watches the victim after the liar arrives")
    ap.add_argument("--neighbours", type=int, default=2,
                    help="other daemons running their own jobs on this machine meanwhile (0: none)")
    add_short(ap, "spoof and fuzz (20 cases a kind); no neighbours")
    args = ap.parse_args(argv)
    if args.short:
        args.parts, args.fuzz, args.neighbours = "spoof,fuzz", 20, 0
    import faults_claims
    import faults_fuzz
    import faults_round2
    import faults_shares
    import faults_spoof

    rng = random.Random(args.seed)
    t = Tally()
    r = faults_round2.Round2()
    r3 = faults_shares.Shares()
    c = faults_claims.Claims()
    parts = {
        "spoof": lambda: faults_spoof.part_spoof(t),
        "round2": lambda: faults_round2.part_round2(t, r),
        "shares": lambda: faults_shares.part_shares(t, r3),
        "curves": lambda: faults_claims.curve_lies(t, c, args.curve_seconds),
        "keys": lambda: faults_claims.key_inflations(t, c),
        "stopcodes": lambda: faults_claims.stop_code_loops(t, c),
        "fuzz": lambda: faults_fuzz.part_fuzz(t, args.fuzz, rng),
        "kills": lambda: part_kills(t, args.kills, rng),
        "restarts": lambda: part_restarts(t),
        "recalls": lambda: part_recalls(t, args.recalls, rng),
    }
    started = time.monotonic()
    with faults_shares.Neighbours(args.neighbours) as neighbours:
        for name in args.parts.split(","):
            t0 = time.monotonic()
            parts[name.strip()]()
            print(f"  ({name}: {time.monotonic() - t0:.0f} s)", flush=True)
        neighbours.check(t)
    print()
    print(f"{'what':<12}{'count':>8}  goal")
    for label, value, goal in (("kills", t.kills, ">= 20"), ("lost", t.lost, "0"), ("duplicated", t.duplicated, "0"),
                               ("recalls", t.recalls, ">= 100"), ("orphans", t.orphans, "0"),
                               ("fuzz cases", t.fuzz, ""), ("tracebacks", t.tracebacks, "0"),
                               ("spoofed", t.spoofed, ""), ("accepted", t.accepted, "0"),
                               ("store", r.store_tried, ""), ("accepted", r.store_accepted, "0"),
                               ("probes", r.probes, ""), ("escaped", r.escaped, "0"),
                               ("fd floods", r.floods, ""), ("down", r.down, "0"),
                               ("job crashes", r3.crashes, ""), ("down", r3.crash_down, "0"),
                               ("lockouts", r3.lockouts, ""), ("delayed", r3.delayed, "0"),
                               ("evictions", r3.evictions, ""), ("evicted", r3.evicted, "0"),
                               ("log floods", r3.floods, ""), ("full", r3.full, "0"),
                               ("curve lies", c.curve_lies, ""), ("taken", c.taken, "0"),
                               ("key inflat.", c.inflations, ""), ("stalls", c.stalls, "0"),
                               ("stop loops", c.loops, ""), ("never fail", c.never_failed, "0")):
        print(f"{label:<12}{value:>8}  {goal}")
    met = t.lost == t.duplicated == t.orphans == t.tracebacks == t.accepted == 0
    met = met and r.store_accepted == r.escaped == r.down == 0
    met = met and r3.crash_down == r3.delayed == r3.evicted == r3.full == 0
    met = met and c.taken == c.stalls == c.never_failed == 0
    print(f"goals {'met' if met else 'NOT met'} in {time.monotonic() - started:.0f} s")
    last_line(f"faults: {t.kills} kills, {t.lost} lost, {t.duplicated} duplicated, {t.recalls} recalls, "
          f"{t.orphans} orphans, {t.fuzz} fuzz cases, {t.tracebacks} tracebacks, "
          f"{t.spoofed} spoofed reports, {t.accepted} accepted, {faults_round2.summary(r)}, "
          f"{faults_shares.summary(r3)}, {faults_claims.summary(c)}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
