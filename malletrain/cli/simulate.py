"""CLI: ``malletrain simulate`` (replay an idle-node trace with elastic training jobs) and
``malletrain evaluate`` (policies x workloads x seeds in model-neutral work, as Dask tasks: tables,
figures, targets)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # heavy imports stay inside the handler
    from traces.model import IdleTimeline

# Policy knobs (Pjmax, Tfwd, ...) default to policy.PolicyConfig's, the daemon's defaults (written
# there only; `malletrain config check` prints them).
# The embedded synthetic trace changes one node at a time (about 294k distinct
# timestamps in a week, against 11,468 in the real Summit log, whose scheduler
# reports in batches); deciding at most once a minute keeps its replay short.
EMBEDDED_MIN_INTERVAL_S = 60.0
SUMMIT_WEEK = "summit-2021-02-10_17.nodes.csv.gz"
DEFAULT_EVAL_WORKLOADS = "philly@1,philly@1.5,philly@2"
# --regimes: the scarce mix, a Philly list every job of which can finish, a saturated Philly stream;
# a day of the dev week on 64 nodes unless --start/--end/--nodes say otherwise (--nodes all: the machine)
REGIMES = {"workloads": "scarce,philly-done@0.3,philly@2", "start": "+78h", "end": "+102h", "nodes": "64",
           "policies": "malletrain,freetrain,greedy,equal,rigid-preemptible,milp-true",
           "priors": "mean,linear,other,noise:20", "fixed_pjmax": "none"}

_OFFSET = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay an idle-node trace with elastic training jobs under a policy",
        description="Replay an idle-node timeline (a scheduler log, or an embedded Summit-like "
        "week) with a stream of elastic training jobs, deciding with the real allocator.",
    )
    p.add_argument("--trace", metavar="FILE", help="scheduler log (any format traces.read knows); "
                   "default: the embedded Summit-like week")
    p.add_argument("--trace-format", metavar="NAME", help="trace format (default: detected)")
    p.add_argument("--workload", default="nas", metavar="nas|hpo|philly|FILE",
                   help="nas, hpo, stress, imagenet7 (generated, endless: a saturation case), philly (real "
                   "arrivals and sizes from the Philly trace on the Pollux curves, scaled by --offered-load; philly-done: "
                   "every job can finish), pollux-done (a second job list of the same trace, sampled as Pollux "
                   "samples its workloads) or a JSON/TOML/CSV job file (default: nas)")
    p.add_argument("--jobs-file", metavar="FILE.csv", help="replay this job list: columns name,time,application"
                   "[,num_replicas,batch_size,samples], time in s from the window's start (same as --workload FILE)")
    p.add_argument("--offered-load", type=float, default=1.0, metavar="X",
                   help="philly: the stream's work over the window's idle node-seconds (default: 1)")
    p.add_argument("--duration", metavar="D", help="window length: seconds or 10m/2h/1d (window end = start + D)")
    p.add_argument("--nodes", metavar="N|NAME,...", help="replay only N nodes of the log (the N with the most "
                   "idle node-seconds in the window, ties by name) or these named nodes")
    p.add_argument("--scaling", metavar="FILE", help="model,nodes,samples_per_second CSV "
                   "(default: summit-scaling.csv from the data dir, else built-in synthetic curves)")
    p.add_argument("--policy", default="malletrain", metavar="NAME[,NAME]|all",
                   help="a preset of the policy (policy.PRESETS): malletrain (the daemon's default: passive "
                   "learning, gated profiling, adaptive admission), malletrain-no-share (the default without fair share "
                   "between users), jpa (the paper's: profile every job, fixed "
                   "Pjmax), freetrain (a user's curve, no learning), milp-true (the true curves), oracle (true "
                   "curves, free rescales), greedy, equal, rigid-preemptible (a fixed count, killed by any "
                   "recall); a comma list, or all (default: malletrain)")
    p.add_argument("--freetrain-model", default="mean", metavar="mean|linear|other|noise:X",
                   help="the user curve freetrain is given: mean of the workload's model curves, linear "
                   "from the 1-node rate, or the true curve with +-X%% noise per point (default: mean)")
    p.add_argument("--prior", default="mean", choices=("mean", "linear"),
                   help="the learning policies' starting belief (malletrain, jpa): the mean of the workload's "
                   "model curves, or linear from the 1-node rate (what a user without data gives); the same "
                   "as evaluate's malletrain:linear (default: mean)")
    p.add_argument("--jobs", type=int, metavar="N", help="finite workload of N jobs (then makespan "
                   "is the metric); default: an endless stream")
    add_policy_options(p)
    p.add_argument("--seed", type=int, default=0, metavar="N", help="workload seed (default: 0)")
    p.add_argument("--start", metavar="T", help="window start: unix seconds or +2h/+1d from trace start")
    p.add_argument("--end", metavar="T", help="window end: unix seconds or +2h/+1d from trace start")
    p.add_argument("--min-interval", type=float, metavar="S",
                   help="ask the policy at most once per S seconds; recalls still apply at once "
                   f"(default: 0 = at every trace timestamp; {EMBEDDED_MIN_INTERVAL_S:g} for the embedded trace)")
    p.add_argument("--charge-start", action="store_true",
                   help="make a job starting from zero nodes pay the scale-up pause too")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    register_evaluate(sub)


def add_policy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy-config", metavar="FILE",
                   help="TOML file with a [policy] table (the daemon's own; keys as in `malletrain config "
                   "check`); the named policy's preset is applied on top of it")
    p.add_argument("--max-running", type=int, metavar="N",
                   help="concurrent jobs Pjmax (default: the daemon's, policy.PolicyConfig.max_running)")
    p.add_argument("--tfwd", type=float, metavar="S",
                   help="allocator horizon Tfwd in seconds (default: the daemon's, policy.PolicyConfig.tfwd_s)")
    p.add_argument("--admission", choices=("adaptive", "fixed"),
                   help="adaptive (Pjmax is a floor: more jobs while nodes would stay idle) or fixed; "
                   "overrides every preset (default: each policy's preset, else adaptive)")
    p.add_argument("--admission-cap", type=int, metavar="N",
                   help="adaptive admission admits at most N jobs (0: no cap); overrides every preset (default: 0)")
    p.add_argument("--objective", choices=("work", "samples", "completion"),
                   help="what the allocator maximises (completion: work while jobs wait, then each job's work "
                   "weighted by how soon it can finish); overrides every preset (default: each preset's, else work)")
    p.add_argument("--users", choices=("workload", "job"), default="workload",
                   help="whose each job is, for fair share ([policy] fairness): workload (as each job says; a "
                   "generated stream is one user) or job (each job its own user) (default: workload)")
    p.add_argument("--calibration", metavar="FILE|free",
                   help="the costs charged (pilot start, cold start, restart + rollback, rescale pause): a "
                   "calibration JSON, or free (the ablation: no start costs) (default: the shipped "
                   "simulator/calibration.json)")


def policy_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The base :class:`policy.PolicyConfig`: the file's [policy] table, then --max-running/--tfwd."""
    import tomllib

    from policy import PolicyConfig

    cfg = PolicyConfig()
    if getattr(args, "policy_config", None):
        path = Path(args.policy_config)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"--policy-config {path}: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"--policy-config {path}: not valid TOML: {exc}") from None
        cfg = PolicyConfig.from_mapping(data.get("policy", {}), f"{path}: policy")
    changes: dict[str, object] = {}
    if args.max_running is not None:
        changes["max_running"] = args.max_running
    if args.tfwd is not None:
        changes["tfwd_s"] = args.tfwd
    return cfg.overridden(changes, {"max_running": "--max-running", "tfwd_s": "--tfwd"})


def overrides(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """--admission, --max-running, --admission-cap, --objective: they win over every preset."""
    from simulator.policies import Overrides

    return Overrides(admission=args.admission, max_running=args.max_running, admission_cap=args.admission_cap,
                     objective=args.objective)


def calibration(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from simulator.calibration import resolve

    return resolve(args.calibration)


def register_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="policies x workloads x seeds on one trace, in model-neutral work: tables, figures, targets",
        description="Replay one trace with the NAS and HPO job streams under freetrain (a panel of user "
        "priors), malletrain, jpa, milp-true, oracle and greedy over several seeds, as Dask tasks; write "
        "evaluation.md, evaluation.json and the figures; print PASS/FAIL per target and exit 1 when one fails.",
    )
    p.add_argument("--trace", metavar="FILE", help="scheduler log (default: the Summit week "
                   "summit-2021-02-10_17.nodes.csv.gz from the data dir, else the embedded Summit-like week)")
    p.add_argument("--trace-format", metavar="NAME", help="trace format (default: detected)")
    p.add_argument("--scaling", metavar="FILE", help="model,nodes,samples_per_second CSV "
                   "(default: summit-scaling.csv from the data dir)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--seeds", default="5", metavar="N|LIST",
                   help="workload seeds: N (= 0..N-1) or a comma list (default: 5 seeds)")
    p.add_argument("--seed", type=int, metavar="N", help="one seed only (same as --seeds N,)")
    add_policy_options(p)
    p.add_argument("--start", metavar="T", help="window start: unix seconds or +2h/+1d from trace start")
    p.add_argument("--end", metavar="T", help="window end: unix seconds or +2h/+1d from trace start")
    p.add_argument("--nodes", metavar="N|NAME,...", help="replay only N nodes of the log (the N with the most "
                   "idle node-seconds in the window) or these named nodes")
    p.add_argument("--min-interval", type=float, metavar="S",
                   help=f"decide at most once per S s (default: 0; {EMBEDDED_MIN_INTERVAL_S:g} for the embedded trace)")
    p.add_argument("--regimes", action="store_true",
                   help="the regimes apart, one command: scarce (learning vs milp-true from the mean and a linear "
                   "belief), unsaturated (philly-done@0.3: completion time), saturated (philly@2: work); a day "
                   "(+78h..+102h) on 64 nodes unless --start/--end/--nodes say otherwise (--nodes all: the machine)")
    p.add_argument("--workloads", default=DEFAULT_EVAL_WORKLOADS, metavar="NAME[,NAME]",
                   help="philly@X (the real Philly stream at offered load X; philly-done@X and pollux-done@X, two job "
                   "lists of it that can finish), scarce (12 jobs of the six models: "
                   "learning against milp-true from the mean and a linear belief), or the endless saturation cases "
                   f"nas, hpo, stress, imagenet7 (default: {DEFAULT_EVAL_WORKLOADS})")
    p.add_argument("--policies", metavar="NAME[,NAME]",
                   help="generated streams: freetrain,malletrain,jpa,milp-true,oracle,greedy; philly: "
                   "malletrain,freetrain,greedy,equal,rigid-preemptible,jpa,milp-true (plus freetrain at each "
                   "--fixed-pjmax and the oracle reference)")
    p.add_argument("--fixed-pjmax", default="10,40,100", metavar="N[,N]",
                   help="philly: freetrain at fixed admission with these Pjmax, a baseline at its own admission "
                   "compared on its own; 'none' for no such rows (default: 10,40,100)")
    p.add_argument("--priors", metavar="MODEL[,MODEL]",
                   help="freetrain's user curves (default: linear,mean,other,noise:20)")
    p.add_argument("--jobs", type=int, metavar="N", help="a finite list of N jobs per replay (makespan, job "
                   "completion times); default: endless streams")
    p.add_argument("--sweep", action="store_true",
                   help="the grid: Pjmax {3, 10, 40} x max nodes per job {16, 64} for every policy, workload, seed")
    p.add_argument("--sweep-tfwd", action="store_true",
                   help="only sweep Tfwd over 30/60/120/300/900 s (milp-true, malletrain) and print the choice")
    p.add_argument("--workers", type=int, default=2, metavar="N",
                   help="Dask LocalCluster worker processes (default: 2; 0 = in this process, no Dask)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="use an existing Dask cluster (e.g. tcp://host:8786, started by dask-jobqueue) "
                   "instead of a LocalCluster")
    figs = p.add_mutually_exclusive_group()
    figs.add_argument("--paper-figures", dest="paper_figures", action="store_true", default=None,
                      help="also write Figs. 3.7-3.9 from the real logs (default: when --trace is not given)")
    figs.add_argument("--no-paper-figures", dest="paper_figures", action="store_false",
                      help="do not write Figs. 3.7-3.9")
    p.add_argument("--no-check", action="store_true", help="report the targets but exit 0 when one fails")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=run_evaluate)


def apply_regimes(args: argparse.Namespace) -> None:
    """``--regimes``: :data:`REGIMES` for every option left at its default."""
    defaults = {"workloads": DEFAULT_EVAL_WORKLOADS, "fixed_pjmax": "10,40,100"}
    for key, value in REGIMES.items():
        if getattr(args, key) == defaults.get(key):
            setattr(args, key, value)


def parse_seeds(text: str) -> tuple[int, ...]:
    """``5`` -> 0..4; ``0,3,7`` -> those (``3,`` is the single seed 3)."""
    t = text.strip()
    try:
        if "," not in t:
            n = int(t)
            if n < 1:
                raise ValueError
            return tuple(range(n))
        seeds = tuple(int(x) for x in t.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--seeds {text!r}: a count >= 1 or a comma list of integers") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: a count >= 1 or a comma list of distinct integers")
    return seeds


def parse_time(text: str | None, trace_start: float, what: str) -> float | None:
    """Unix seconds (``1612915732``) or an offset from the trace start (``+2h``, ``+1d``, ``+90``)."""
    if text is None:
        return None
    m = _OFFSET.match(text.strip())
    if m:
        return trace_start + float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--{what} {text!r}: expected unix seconds or an offset like +2h, +1d") from None


def parse_policies(text: str) -> list[str]:
    from simulator.policies import POLICIES

    names = list(POLICIES) if text.strip() == "all" else [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise ValueError(f"--policy {text!r}: unknown {', '.join(unknown) or 'empty'}; "
                         f"choose from {', '.join(POLICIES)} or all")
    return names


def evaluation_timeline(path: str | None, fmt: str | None) -> tuple[IdleTimeline, bool]:
    """The given trace, else the Summit week from the data dir, else the embedded week (True: embedded)."""
    if path is not None:
        return load_timeline(path, fmt), False
    from traces.data import find_data

    found = find_data(SUMMIT_WEEK)
    if found is not None:
        return load_timeline(str(found), fmt), False
    print(f"malletrain evaluate: note: {SUMMIT_WEEK} not found (set MALLETRAIN_DATA); using the embedded "
          "SYNTHETIC Summit-like week instead", file=sys.stderr)
    return default_timeline(), True


def run_evaluate(args: argparse.Namespace) -> int:
    from simulator import find_scaling
    from evaluation.evaluate import evaluate
    from evaluation.report import print_report, write_evaluation
    from evaluation.results import POLICIES, PRIORS, EvalSettings
    from simulator.policies import POLICIES as KNOWN, parse_error_model
    from evaluation.sweep import Progress
    from simulator.workload import GENERATED_STREAMS, REAL_STREAMS

    from simulator.policies import Overrides
    from evaluation.sweep import split_workload

    if args.regimes:
        apply_regimes(args)
    base = policy_config(args)
    if args.workers < 0:
        raise ValueError(f"--workers must be >= 0, got {args.workers}")
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    try:
        bad = [w for w in workloads if split_workload(w)[0] not in GENERATED_STREAMS + REAL_STREAMS]
    except ValueError:
        bad = list(workloads)
    if bad or not workloads:
        raise ValueError(f"--workloads {args.workloads!r}: a comma list of philly@X (X > 0), scarce and "
                         f"{', '.join(GENERATED_STREAMS)}")
    over = Overrides(admission=args.admission or base.admission.value, max_running=args.max_running,
                     admission_cap=args.admission_cap, objective=args.objective or "work")
    fixed: tuple[int, ...] = ()
    try:
        fixed = () if args.fixed_pjmax.strip() == "none" else \
            tuple(int(x) for x in args.fixed_pjmax.split(",") if x.strip())
        wrong = args.fixed_pjmax.strip() != "none" and (not fixed or min(fixed) < 1)
    except ValueError:
        wrong = True
    if wrong:
        raise ValueError(f"--fixed-pjmax {args.fixed_pjmax!r}: a comma list of integers >= 1, or none")
    policies = _names(args.policies, "--policies", KNOWN) if args.policies else POLICIES
    priors = tuple(p.strip() for p in args.priors.split(",") if p.strip()) if args.priors else PRIORS
    for prior in priors:
        parse_error_model(prior)
    seeds = (args.seed,) if args.seed is not None else parse_seeds(args.seeds)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.sweep and args.sweep_tfwd:
        raise ValueError("--sweep and --sweep-tfwd: choose one")
    timeline, embedded = evaluation_timeline(args.trace, args.trace_format)
    if args.min_interval is not None and args.min_interval < 0:
        raise ValueError(f"--min-interval must be >= 0, got {args.min_interval}")
    interval = args.min_interval if args.min_interval is not None else (EMBEDDED_MIN_INTERVAL_S if embedded else 0.0)
    start, end = parse_time(args.start, timeline.start, "start"), parse_time(args.end, timeline.start, "end")
    if args.nodes is not None and args.nodes != "all":
        from simulator.window import restrict

        timeline = restrict(timeline, parse_nodes(args.nodes), start, end)
    settings = EvalSettings(
        seeds=seeds, policy_config=base, start=start, end=end,
        min_interval_s=interval, workers=args.workers, scheduler=args.scheduler, workloads=workloads,
        policies=policies, priors=priors, n_jobs=args.jobs, sweep=args.sweep, tfwd_sweep=args.sweep_tfwd,
        overrides=over, flags=overrides(args), calibration=calibration(args), fixed_pjmax=fixed,
        users=args.users,
    )
    scaling = find_scaling(args.scaling)
    if scaling.synthetic:
        print("malletrain evaluate: note: no summit-scaling.csv found; using SYNTHETIC scaling curves",
              file=sys.stderr)
    from evaluation.evaluate import run_specs

    progress = Progress(len(run_specs(settings)), quiet=args.quiet)
    try:
        ev = evaluate(timeline, scaling, settings, on_done=progress)
    finally:
        progress.close()
    command = "malletrain evaluate " + " ".join(_quoted(a) for a in _argv_of(args))
    out = Path(args.out)
    write_evaluation(ev, out, command)
    figures = args.paper_figures if args.paper_figures is not None else (args.trace is None and not args.sweep_tfwd)
    if figures:
        from evaluation.figures import paper_figures

        notes = paper_figures(out, capacity_nodes=base.max_running * 64)
        (out / "figures.md").write_text(
            "# MalleTrain Figs. 3.7-3.10, regenerated\n\n"
            f"Generated by `{command}`.\n\n" + "\n".join(notes)
            + ("\n- **3.10** `fig3_10.png`: FreeTrain vs MalleTrain (and the other baselines), NAS and HPO, in "
               "model-neutral work, mean ± sd over the seeds; tables in [evaluation.md](evaluation.md).\n"
               if (out / "fig3_10.png").exists() and any(not w.startswith("philly") for w in workloads) else
               "\n- **real streams** `fig_real.png`: the default vs the best fixed-prior baseline at the default's admission "
               "on the real Philly stream, costs charged; tables in [evaluation.md](evaluation.md).\n"))
    print_report(ev)
    print(f"wrote {out}", file=sys.stderr)
    failed = [t for t in ev.targets if not t.passed]
    if failed and not args.no_check:
        print(f"malletrain evaluate: {len(failed)} of {len(ev.targets)} targets FAIL (--no-check to only report)",
              file=sys.stderr)
        return 1
    return 0


def _names(text: str, option: str, known) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    names = tuple(w.strip() for w in text.split(",") if w.strip())
    bad = [w for w in names if w not in known]
    if bad or not names:
        raise ValueError(f"{option} {text!r}: a comma list of {', '.join(known)}")
    return names


def _quoted(a: str) -> str:
    return a if a and all(c.isalnum() or c in "-_./:+=," for c in a) else repr(a)


def _argv_of(args: argparse.Namespace) -> list[str]:
    """The options that differ from the defaults, as a user would type them."""
    out: list[str] = []
    for opt, default in (("trace", None), ("trace_format", None), ("scaling", None), ("seeds", "5"), ("seed", None),
                         ("policy_config", None), ("max_running", None), ("tfwd", None), ("start", None), ("end", None),
                         ("min_interval", None), ("workloads", DEFAULT_EVAL_WORKLOADS), ("policies", None),
                         ("priors", None), ("nodes", None), ("admission", None), ("admission_cap", None), ("objective", None),
                         ("calibration", None), ("fixed_pjmax", "10,40,100"),
                         ("jobs", None), ("users", "workload"), ("workers", 2), ("scheduler", None), ("out", None)):
        value = getattr(args, opt)
        if value != default:
            out += [f"--{opt.replace('_', '-')}", str(value)]
    for flag in ("regimes", "sweep", "sweep_tfwd", "no_check"):
        if getattr(args, flag):
            out.append(f"--{flag.replace('_', '-')}")
    if args.paper_figures is not None:
        out.append("--paper-figures" if args.paper_figures else "--no-paper-figures")
    return out


def window_of(args: argparse.Namespace, timeline: IdleTimeline) -> tuple[float | None, float | None]:
    """--start, and --end or --duration (not both), as unix seconds."""
    start = parse_time(args.start, timeline.start, "start")
    end = parse_time(args.end, timeline.start, "end")
    duration = getattr(args, "duration", None)
    if duration is not None:
        if end is not None:
            raise ValueError(f"--end {args.end} and --duration {duration}: give one")
        m = _OFFSET.match("+" + duration.strip().lstrip("+"))
        if not m or float(m.group(1)) <= 0:
            raise ValueError(f"--duration {duration!r}: expected seconds > 0 or 10m, 2h, 1d")
        end = (start if start is not None else timeline.start) + float(m.group(1)) * _UNITS[m.group(2)]
    return start, end


def parse_nodes(text: str) -> int | tuple[str, ...]:
    """``6`` -> a count; ``a,b,c`` -> those nodes."""
    t = text.strip()
    if t.isdigit():
        if int(t) < 1:
            raise ValueError(f"--nodes {text!r}: a count >= 1 or a comma list of node names")
        return int(t)
    names = tuple(n.strip() for n in t.split(",") if n.strip())
    if not names:
        raise ValueError(f"--nodes {text!r}: a count >= 1 or a comma list of node names")
    return names


def load_timeline(path: str | None, fmt: str | None) -> IdleTimeline:
    if path is None:
        return default_timeline()
    import traces

    if not Path(path).exists():
        raise FileNotFoundError(f"--trace {path}: no such file")
    return traces.read(path, format=fmt) if fmt else traces.read(path)


def default_timeline() -> IdleTimeline:
    """The embedded Summit-like week: 4,608 nodes fitted to the real Summit log, no file needed."""
    from traces.synthetic import summit_like

    return summit_like()


def min_interval(args: argparse.Namespace) -> float:
    if args.min_interval is not None:
        if args.min_interval < 0:
            raise ValueError(f"--min-interval must be >= 0, got {args.min_interval}")
        return args.min_interval
    return EMBEDDED_MIN_INTERVAL_S if args.trace is None else 0.0


def run(args: argparse.Namespace) -> int:
    from simulator import SimConfig, find_scaling, simulate
    from evaluation.replay_report import ProgressBar, comparison_rows, comparison_table, summary_table, write_outputs

    policies = parse_policies(args.policy)
    from simulator.policies import parse_error_model, resolve_config

    parse_error_model(args.freetrain_model)  # a bad model is reported before any replay
    base = policy_config(args)
    over = overrides(args)
    for name in policies:  # an impossible combination is reported before any replay
        resolve_config(name, base, over)
    cal = calibration(args)
    if args.jobs_file is not None:
        if args.workload != "nas":
            raise ValueError(f"--jobs-file {args.jobs_file} and --workload {args.workload}: give one")
        if not Path(args.jobs_file).is_file():
            raise FileNotFoundError(f"--jobs-file {args.jobs_file}: no such file")
        args.workload = args.jobs_file
    if not args.offered_load > 0:
        raise ValueError(f"--offered-load must be > 0, got {args.offered_load}")
    timeline = load_timeline(args.trace, args.trace_format)
    start, end = window_of(args, timeline)
    if args.nodes is not None:
        from simulator.window import restrict

        timeline = restrict(timeline, parse_nodes(args.nodes), start, end)
    config = SimConfig(start=start, end=end, charge_start=args.charge_start, min_interval_s=min_interval(args),
                       calibration=cal, users=args.users)
    scaling = find_scaling(args.scaling)
    if scaling.synthetic:
        print("malletrain simulate: note: no summit-scaling.csv found; using SYNTHETIC scaling curves",
              file=sys.stderr)
    out = Path(args.out)
    summaries = []
    for name in policies:
        bar = ProgressBar(name, enabled=not args.quiet)
        try:
            result = simulate(timeline, name, args.workload, scaling=scaling, seed=args.seed,
                              n_jobs=args.jobs, config=config, progress=bar, freetrain_model=args.freetrain_model,
                              policy_config=base, overrides=over, offered_load=args.offered_load,
                              learning_prior=args.prior)
        finally:
            bar.close()
        target = out if len(policies) == 1 else out / name
        write_outputs(result, target, plots=not args.no_plots)
        summaries.append(result.summary)
        if len(policies) == 1:
            print(summary_table(result.summary))
    if len(policies) > 1:
        (out / "comparison.json").write_text(json.dumps(comparison_rows(summaries), indent=2) + "\n")
        print(comparison_table(summaries))
    print(f"wrote {out}", file=sys.stderr)
    return 0
