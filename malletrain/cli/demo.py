"""``malletrain demo``: the daemon on 6 local nodes that come and go, with real PyTorch jobs.

A synthetic Summit-like trace (its first 6 idle nodes, 5x real time) recalls nodes while three small
CPU jobs with different scaling train (``cnn`` profiled, ``mlp`` a guessed curve, ``linear`` its own);
``--runtime horovod`` or ``toy`` run the same roles. After ``--duration`` seconds everything stops,
no process is left behind, and DIR gets ``report.md``, ``report.json`` and ``nodes.png``."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from malletrain.daemon.config import DaemonConfig, LocalConfig
from policy import PolicyConfig, preset
from malletrain.daemon import Daemon
from malletrain.daemon.jobspec import JobSpec
from malletrain.cli.procs import procs_mentioning
from malletrain.daemon.store import Store

DEMO_SEED = 7
DEMO_TIME_SCALE = 5.0
DEMO_MACHINE = 64


def demo_jobs(runtime: str) -> list[JobSpec]:
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if runtime == "toy":
        toy = (sys.executable, "-m", "malletrain.worker.toy")
        return [
            JobSpec("cnn", toy + ("--rate", "400", "--alpha", "0.95"), 1, 4, True, None, None, None, env),
            JobSpec("mlp", toy + ("--rate", "600", "--alpha", "0.4"), 1, 3, False, None, None, None, env),
            JobSpec("linear", toy + ("--rate", "2000", "--alpha", "0.7"), 1, 2, False,
                    {1: 2000.0, 2: 3200.0}, None, None, env),
        ]
    if runtime == "horovod":
        hvd = (sys.executable, "-m", "malletrain.worker.examples.hvd_train", "--steps", "1000000000")
        return [
            JobSpec("hvd-prof", hvd + ("--batch-size", "32", "--step-sleep", "0.02"), 1, 4, True,
                    None, None, None, env),
            JobSpec("hvd-guess", hvd + ("--batch-size", "64", "--step-sleep", "0.02"), 1, 3, False,
                    None, None, None, env),
            JobSpec("hvd-given", hvd + ("--batch-size", "128", "--step-sleep", "0.02"), 1, 2, False,
                    {1: 3000.0, 2: 5000.0}, None, None, env),
        ]
    train = (sys.executable, "-m", "malletrain.worker.examples.train", "--samples", "1000000000")
    return [
        JobSpec("cnn", train + ("--model", "cnn", "--batch", "16"), 1, 4, True, None, None, None, env),
        JobSpec("mlp", train + ("--model", "mlp", "--width", "512"), 1, 3, False, None, None, None, env),
        JobSpec("linear", train + ("--model", "linear", "--batch", "64"), 1, 2, False,
                {1: 3000.0, 2: 5000.0}, None, None, env),
    ]


DEMO_POLICIES = ("malletrain", "jpa")  # the daemon's default, and the paper's profile-every-job policy


def demo_config(state: Path, nodes: int, runtime: str, policy: str = "malletrain") -> DaemonConfig:
    if policy not in DEMO_POLICIES:
        raise ValueError(f"demo policy {policy!r}: choose one of {', '.join(DEMO_POLICIES)}")
    return DaemonConfig(
        state_dir=str(state), runtime=runtime, loop_interval=0.1,
        agent_heartbeat=0.5, agent_dead_after=10.0,
        # the demo runs the trace 5x faster than real time: a shorter horizon and profile cap
        policy=preset(policy, PolicyConfig(tfwd_s=60.0, profile_time_cap_s=15.0)),
        local=LocalConfig(nodes=nodes, trace="synthetic", time_scale=DEMO_TIME_SCALE, seed=DEMO_SEED,
                          duration=7200.0, machine_nodes=DEMO_MACHINE),
    )


def run_demo(out: str, duration: float, nodes: int = 6, runtime: str = "torch", live: bool = True,
             policy: str = "malletrain") -> int:
    out_dir = Path(out)
    state = out_dir / "state"
    if state.exists():
        shutil.rmtree(state)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"demo: starting the daemon ({runtime} runtime; the first import of torch can take a while)", flush=True)
    if runtime == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            print("malletrain demo: torch is not installed; use --runtime toy or pip install -e '.[torch]'",
                  file=sys.stderr)
            return 2
    if runtime == "horovod":
        try:
            import horovod.torch  # noqa: F401
        except ImportError as exc:
            print(f"malletrain demo: horovod.torch does not import ({exc}); build it with "
                  "bash .ci/build-horovod.sh .venv, or use --runtime torch", file=sys.stderr)
            return 2
    daemon = Daemon(demo_config(state, nodes, runtime, policy))
    ids = [daemon.store.submit(spec) for spec in demo_jobs(runtime)]
    print(f"demo: {nodes} local nodes following a synthetic Summit-like trace ({DEMO_TIME_SCALE:g}x), "
          f"{len(ids)} {runtime} jobs, policy {policy}, {duration:g} s; state in {state}", flush=True)
    start = time.time()
    next_show = [start + 5.0]

    def tick(d: Daemon) -> None:
        if live and time.time() >= next_show[0]:
            next_show[0] += 10.0
            show(d, time.time() - start)

    try:
        daemon.run(duration, on_tick=tick)
        print(f"demo: {duration:g} s are up; stopping the workers, releasing the nodes, writing the report",
              flush=True)
    finally:
        daemon.close()
    leftovers = _kill_leftovers(str(state.resolve()))
    report = build_report(Store.open(state / "store.db"), start, duration, runtime, leftovers)
    report["policy"] = policy
    write_report(out_dir, report)
    print(f"demo: report in {out_dir}/report.md (+ report.json, nodes.png); "
          f"{leftovers} processes left behind", flush=True)
    return 0 if leftovers == 0 else 1


def show(d: Daemon, elapsed: float) -> None:
    from malletrain.cli.status_view import format_jobs, format_notes

    print(f"\n--- t = {elapsed:5.1f} s ---")
    jobs = d.api.status_jobs()
    print(format_jobs(jobs))
    notes = format_notes(jobs)
    if notes:
        print(notes)
    held = sum(1 for n in d.api.status_nodes() if n["state"] == "held")
    used = sum(1 for n in d.api.status_nodes() if n["job"])
    print(f"nodes: {held} held, {used} used   " + " ".join(f"{n['node']}:{n['state']}" for n in d.api.status_nodes()),
          flush=True)


def _kill_leftovers(state: str) -> int:
    """Processes whose command line or environment names the demo's state dir (should be none)."""
    found = []
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        found = procs_mentioning(state)
        if not found:
            return 0
        time.sleep(0.2)
    for p in found:
        try:
            p.kill()
        except psutil.Error:
            pass
    return len(found)


def build_report(store: Store, start: float, duration: float, runtime: str, leftovers: int) -> dict[str, Any]:
    jobs = []
    for rec in store.jobs():
        hist = store.history(rec.id)
        rescales = store.rescales(rec.id)
        jobs.append({
            "id": rec.id, "name": rec.spec.name, "state": rec.state.value, "samples": rec.samples,
            "min_nodes": rec.spec.min_nodes, "max_nodes": rec.spec.max_nodes, "profile": rec.spec.profile,
            "scaling_measured": {str(k): round(v, 1) for k, v in store.scaling(rec.id).items()},
            "states": [{"t": round(t - start, 2), "state": s, "reason": r} for s, t, r in hist],
            "rescales": [{"t": round(r["time"] - start, 2), "from": r["from_nodes"], "to": r["to_nodes"],
                          "pause_s": round(r["pause_s"], 3), "kind": r["kind"]} for r in rescales],
        })
    recalls = [round(e["time"] - start, 2) for e in store.events("pilot_ended") if e.get("reason") == "preempted"]
    for j in jobs:
        for r in j["rescales"]:
            # a shrink right after a recall is the recovery from it; a job placed again after a
            # suspension waited for nodes (not a pause of running workers); the rest were planned
            if r["kind"] == "resume":
                r["cause"] = "resume"
            else:
                r["cause"] = "recall" if r["kind"] == "down" and any(0 <= r["t"] - x <= 10 for x in recalls) else "plan"
    series = [{"t": round(e["time"] - start, 2), "idle": e["idle"], "held": e["held"], "used": e["used"],
               "jobs": e.get("jobs", {})} for e in store.events("nodes")]
    return {"runtime": runtime, "duration_s": duration, "jobs": jobs, "nodes": series,
            "recalls_of_held_nodes": recalls, "leftover_processes": leftovers,
            "max_planned_pause_s": max((r["pause_s"] for j in jobs for r in j["rescales"] if r["cause"] == "plan"),
                                       default=None),
            "max_recall_recovery_s": max((r["pause_s"] for j in jobs for r in j["rescales"] if r["cause"] == "recall"),
                                         default=None)}


def write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=1))
    _plot(out / "nodes.png", report)
    lines = [
        "# malletrain demo report", "",
        f"Runtime `{report['runtime']}`, policy `{report.get('policy', 'malletrain')}`, {report['duration_s']:g} s, "
        f"{len(report['recalls_of_held_nodes'])} recalls of held nodes, "
        f"{report['leftover_processes']} processes left behind.", "",
        "| job | name | final state | samples trained | nodes min-max | measured samples/s by nodes | rescales |",
        "|---|---|---|---|---|---|---|",
    ]
    for j in report["jobs"]:
        scal = ", ".join(f"{k}: {v}" for k, v in j["scaling_measured"].items()) or "-"
        lines.append(f"| {j['id']} | {j['name']} | {j['state']} | {j['samples']} | "
                     f"{j['min_nodes']}-{j['max_nodes']} | {scal} | {len(j['rescales'])} |")
    lines += ["", "## Rescales and their measured pause", "",
              f"Longest planned pause: {report['max_planned_pause_s']} s; longest recovery after a recall: "
              f"{report['max_recall_recovery_s']} s (time lost between the last step before and the first "
              "step after, minus one step).", "",
              "| t (s) | job | nodes | cause | pause (s) |", "|---|---|---|---|---|"]
    for j in report["jobs"]:
        for r in j["rescales"]:
            lines.append(f"| {r['t']} | {j['name']} | {r['from']} -> {r['to']} | {r['cause']} | {r['pause_s']} |")
    lines += ["", "## Nodes held vs used", "", "![nodes](nodes.png)", ""]
    (out / "report.md").write_text("\n".join(lines))


def _plot(path: Path, report: dict[str, Any]) -> None:
    from traces.plots import legend_outside, pyplot

    try:
        plt = pyplot()
    except ImportError:
        return
    s = report["nodes"]
    if not s:
        return

    t = [p["t"] for p in s]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    bottom = [0] * len(s)
    for j in report["jobs"]:
        ys = [p["jobs"].get(j["id"], 0) for p in s]
        if any(ys):
            top = [b + y for b, y in zip(bottom, ys)]
            ax.fill_between(t, bottom, top, step="post", alpha=0.5, label=f"used by {j['name']}")
            bottom = top
    # idle wide and light under held: where the agents hold every idle node both lines still show
    ax.step(t, [p["idle"] for p in s], where="post", label="idle (trace)", color="0.75", lw=3.5)
    ax.step(t, [p["held"] for p in s], where="post", label="held (agents)", color="C0", lw=1.2)
    for k, r in enumerate(report["recalls_of_held_nodes"]):
        ax.axvline(r, color="red", lw=0.8, ls=":", label="recall of a held node" if k == 0 else None)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("nodes")
    ax.set_ylim(bottom=0)
    ax.set_title("nodes held vs used (SYNTHETIC Summit-like trace)")
    legend_outside(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
