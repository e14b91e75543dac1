"""Several trainers in one daemon (issue F §5, MalleTrain §3.1.4): ``[[trainers]]`` in the config,
``trainer`` in a job file, one policy (and one saved state) per trainer over its own nodes."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Callable

import pytest

from malletrain.daemon.config import (
    ConfigError,
    DaemonConfig,
    LocalConfig,
    TrainerConfig,
    node_trainer,
    parse_config,
    to_json,
    to_toml,
)
from malletrain.daemon.control import Caller, Submit
from malletrain.daemon import POLICY_STATE_KEY, Daemon, read_policy_states
from malletrain.daemon.jobspec import JobSpec, JobSpecError, JobState, parse_spec
from malletrain.cli.status_view import format_jobs, format_nodes
from policy import PolicyConfig, PolicyState
from procs import procs_mentioning
from tests.fakes import FakeCluster
from tests.test_conformance import LINEAR, NODES, Harness
from tests.stepping import step_until

TOY = (sys.executable, "-m", "malletrain.worker.toy")

TWO = """
[policy]
max_running = 3
profiling = "never"

[[trainers]]
name = "vision"
nodes = ["node0[0-1]"]
[trainers.policy]
max_running = 1
admission = "fixed"

[[trainers]]
name = "lm"
"""


# ------------------------------------------------------------------ config
def test_trainers_parse_with_policy_defaults_from_the_policy_table() -> None:
    cfg = parse_config(tomllib.loads(TWO))
    vision, lm = cfg.trainers
    assert (vision.name, vision.nodes, lm.name, lm.nodes) == ("vision", ("node0[0-1]",), "lm", None)
    assert vision.policy.max_running == 1 and vision.policy.admission.value == "fixed"
    assert vision.policy.profiling.value == "never"  # from [policy]
    assert lm.policy == cfg.policy and lm.policy.max_running == 3
    assert cfg.trainer_list() == cfg.trainers


def test_no_trainers_is_one_default_trainer_on_every_node() -> None:
    cfg = parse_config(tomllib.loads("[policy]\nmax_running = 2\n"))
    assert cfg.trainers == ()
    assert cfg.trainer_list() == (TrainerConfig("default", None, cfg.policy),)
    assert "trainers" not in to_toml(cfg)


def test_trainers_round_trip_through_config_check_output() -> None:
    cfg = parse_config(tomllib.loads(TWO))
    text = to_toml(cfg)
    assert '[[trainers]]\nname = "vision"\nnodes = ["node0[0-1]"]\n[trainers.policy]' in text
    assert parse_config(tomllib.loads(text)) == cfg
    trainers = json.loads(to_json(cfg))["trainers"]
    assert [(t["name"], t["nodes"], t["policy"]["max_running"]) for t in trainers] == [
        ("vision", ["node0[0-1]"], 1), ("lm", None, 3)]


@pytest.mark.parametrize("text, why", [
    ('trainers = "x"', r"trainers must be an array of tables"),
    ("trainers = []", r"trainers must be an array of tables"),
    ('[[trainers]]\nnodes = ["a"]', r"trainers\[0\]\.name must be 1-64"),
    ('[[trainers]]\nname = "a b"', r"trainers\[0\]\.name must be 1-64 .* got 'a b'"),
    ('[[trainers]]\nname = "' + "x" * 65 + '"', r"trainers\[0\]\.name must be 1-64"),
    ('[[trainers]]\nname = "a"\nnodes = ["n1"]\n[[trainers]]\nname = "a"',
     r"trainers\[1\]\.name 'a' is also trainers\[0\]'s"),
    ('[[trainers]]\nname = "a"\n[[trainers]]\nname = "b"', r"trainers\[1\]\.nodes is missing, as trainers\[0\]'s"),
    ('[[trainers]]\nname = "a"\nnodes = []', r"trainers\[0\]\.nodes must be a non-empty list"),
    ('[[trainers]]\nname = "a"\nnodes = "node*"', r"trainers\[0\]\.nodes must be a non-empty list"),
    ('[[trainers]]\nname = "a"\nnodes = ["n", 3]', r"trainers\[0\]\.nodes must be a non-empty list"),
    ('[[trainers]]\nname = "a"\nnodes = ["n\\u0000"]', r"trainers\[0\]\.nodes\[0\] contains a NUL byte"),
    ('[[trainers]]\nname = "a"\npartition = "x"', r"unknown key\(s\) trainers\[0\]\.partition"),
    ('[[trainers]]\nname = "a"\npolicy = 3', r"trainers\[0\]\.policy must be a table"),
    ('[[trainers]]\nname = "a"\n[trainers.policy]\nmax_running = -1', r"trainers\[0\]\.policy\.max_running must be"),
    ('[[trainers]]\nname = "a"\n[trainers.policy]\ntfwd_s = nan', r"trainers\[0\]\.policy\.tfwd_s must be a finite"),
    ('[[trainers]]\nname = "a"\n[trainers.policy]\nnope = 1', r"trainers\[0\]\.policy: unknown key\(s\) nope"),
])
def test_trainer_errors_name_the_key(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_config(tomllib.loads(text), "d.toml")


# ------------------------------------------------------------------ nodes and jobs
def test_a_node_belongs_to_the_first_trainer_matching_it_else_the_catch_all() -> None:
    trainers = (TrainerConfig("a", ("node0[0-1]", "gpu*")), TrainerConfig("rest"),
                TrainerConfig("b", ("node0*",)))
    assert [node_trainer(trainers, n) for n in ("node00", "node01", "node02", "gpu7", "NODE00")] == \
        ["a", "a", "b", "a", "rest"]  # patterns are case-sensitive
    no_catch_all = trainers[:1] + trainers[2:]
    assert node_trainer(no_catch_all, "cpu1") is None


def test_a_job_names_its_trainer() -> None:
    spec = parse_spec({"command": ["x"], "trainer": "vision"})
    assert spec.trainer == "vision" and JobSpec.from_json(spec.to_json()) == spec
    plain = parse_spec({"command": ["x"]})
    assert plain.trainer is None and "trainer" not in json.loads(plain.to_json())  # stored as before
    for bad in ("", "a b", 3, "x" * 65):
        with pytest.raises(JobSpecError, match="job.toml: trainer must be a trainer's name"):
            parse_spec({"command": ["x"], "trainer": bad}, "job.toml")


def test_an_old_single_policy_state_is_the_first_trainers() -> None:
    st = PolicyState(admitted=["j000001"])
    assert read_policy_states(st.to_json(), "default") == {"default": st}
    keyed = {"a": json.loads(st.to_json()), "version": json.loads(PolicyState().to_json())}  # a trainer "version"
    assert read_policy_states(json.dumps(keyed), "x") == {"a": st, "version": PolicyState()}


# ------------------------------------------------------------------ the daemon, fakes (no process)
def two_trainers(vision: PolicyConfig, lm: PolicyConfig) -> tuple[TrainerConfig, ...]:
    return (TrainerConfig("vision", ("n0[1-2]",), vision), TrainerConfig("lm", None, lm))


VISION = PolicyConfig(max_running=1, profiling="never", admission="fixed")
LM = PolicyConfig(max_running=4, profiling="requested", profile_time_cap_s=60.0)


def test_unknown_trainer_is_refused_at_submit_and_failed_from_the_store(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(), trainers=two_trainers(VISION, LM))
    try:
        with pytest.raises(JobSpecError, match=r"no trainer 'nlp' in this daemon \(its trainers: vision, lm\)"):
            h.daemon.api.handle(Submit({"command": ["x"], "trainer": "nlp"}, 0, 0), Caller(0, 0, True))
        assert h.daemon.store.jobs() == []
        ok = h.daemon.api.handle(Submit({"command": ["x"], "trainer": "lm"}, 0, 0), Caller(0, 0, True))
        assert ok["ok"] and h.daemon.store.require(ok["id"]).spec.trainer == "lm"
        # the CLI wrote it straight into the store (no daemon answered)
        jid = h.daemon.store.submit(JobSpec("x", ("true",), trainer="nlp"))
        h.step(1.0)
        rec = h.daemon.store.require(jid)
        assert rec.state is JobState.FAILED and "no trainer 'nlp'" in rec.message and jid not in h.daemon.runs
    finally:
        h.close()
    # a daemon started on a store holding such a job fails it at load
    jid = _submit_to_store(tmp_path / "e", JobSpec("y", ("true",), trainer="gone"))
    h2 = Harness(tmp_path / "e", PolicyConfig())
    try:
        rec = h2.daemon.store.require(jid)
        assert rec.state is JobState.FAILED and rec.message == "no trainer 'gone' in this daemon (its trainers: default)"
    finally:
        h2.close()


def _submit_to_store(state_dir: Path, spec: JobSpec) -> str:
    from malletrain.daemon.store import Store

    state_dir.mkdir(parents=True)
    store = Store.open(state_dir / "store.db")
    try:
        return store.submit(spec)
    finally:
        store.close()


def _lending(h: Harness) -> tuple[str, str]:
    """In trainer lm (n03..n08): A runs on 4 nodes, B (profile = true) borrows 2 of them."""
    h.cluster.became_idle(*NODES)
    a = h.daemon.store.submit(JobSpec("A", ("true",), 1, 4, trainer="lm"))
    h.monitor.curves[a] = dict(LINEAR)
    v = h.daemon.store.submit(JobSpec("V", ("true",), 1, 4, trainer="vision"))
    h.monitor.curves[v] = dict(LINEAR)
    h.run_until(5.0)
    b = h.daemon.store.submit(JobSpec("B", ("true",), 1, 4, profile=True, trainer="lm"))
    h.monitor.curves[b] = {1: 50.0, 2: 95.0, 4: 170.0}
    h.run_until(10.0)
    return a, b


def test_a_restart_keeps_every_trainers_policy_state(tmp_path: Path) -> None:
    cluster = FakeCluster(NODES)
    h = Harness(tmp_path / "d", PolicyConfig(), cluster=cluster, trainers=two_trainers(VISION, LM))
    a, b = _lending(h)
    lm, vision = h.daemon.trainers["lm"].policy.state, h.daemon.trainers["vision"].policy.state
    assert b in lm.profiles and lm.debts[b].lender == a
    assert vision.admitted and not vision.profiles  # its own state: V only
    saved = json.loads(h.daemon.store.get_meta(POLICY_STATE_KEY))
    assert list(saved) == ["vision", "lm"]
    h.close()
    h2 = Harness(tmp_path / "d", PolicyConfig(), cluster=cluster, now=11.0, trainers=two_trainers(VISION, LM))
    try:
        st = h2.daemon.trainers["lm"].policy.state
        assert st.profiles[b].count == lm.profiles[b].count and st.debts[b] == lm.debts[b]
        assert h2.daemon.trainers["vision"].policy.state.to_json() == vision.to_json()
    finally:
        h2.close()


def test_an_old_single_state_loads_as_the_default_trainers(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", LM)
    h.cluster.became_idle(*NODES[:4])
    a = h.submit("A", LINEAR, max_nodes=4)
    h.run_until(3.0)
    old = h.daemon.policy.state.to_json()
    h.close()
    from malletrain.daemon.store import Store

    store = Store.open(tmp_path / "d" / "store.db")
    try:
        store.set_meta(POLICY_STATE_KEY, old)  # as a daemon before [[trainers]] left it
    finally:
        store.close()
    h2 = Harness(tmp_path / "d", LM, cluster=h.cluster, now=4.0)
    try:
        assert h2.daemon.policy.state.to_json() == old and a in h2.daemon.policy.state.admitted
        h2.run_until(6.0)
        assert set(json.loads(h2.daemon.store.get_meta(POLICY_STATE_KEY))) == {"default"}
    finally:
        h2.close()


def test_status_shows_each_jobs_and_each_nodes_trainer(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(), trainers=two_trainers(VISION, LM))
    try:
        a, b = _lending(h)
        jobs = {j["id"]: j for j in h.daemon.api.status_jobs()}
        assert jobs[a]["trainer"] == "lm" and jobs[b]["trainer"] == "lm"
        assert {j["trainer"] for j in jobs.values()} == {"vision", "lm"}
        nodes = {n["node"]: n["trainer"] for n in h.daemon.api.status_nodes()}
        assert nodes == {n: ("vision" if n in ("n01", "n02") else "lm") for n in NODES}
        assert "TRAINER" in format_jobs(list(jobs.values())).splitlines()[0]
        assert format_nodes(h.daemon.api.status_nodes()).splitlines()[1].split()[:3] == ["n01", "held", "vision"]
    finally:
        h.close()


# ------------------------------------------------------------------ the daemon, real agents (toy runtime)
def until(d: Daemon, pred: Callable[[], bool], check: Callable[[], None], timeout: float = 30.0) -> None:
    step_until(d, pred, timeout, check=check)


@pytest.mark.slow
def test_two_trainers_run_side_by_side_on_their_own_nodes(tmp_path: Path) -> None:
    vision = PolicyConfig(max_running=1, admission="fixed", profiling="never")
    lm = PolicyConfig(max_running=4, profiling="never", objective="samples")
    cfg = DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy", local=LocalConfig(nodes=4, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=4.0, loop_interval=0.05,
                       trainers=(TrainerConfig("vision", ("node0[0-1]",), vision), TrainerConfig("lm", None, lm)))
    d = Daemon(cfg)
    try:
        v1 = d.store.submit(JobSpec("v1", TOY + ("--rate", "2000"), 1, 4, scaling={1: 100.0, 2: 190.0},
                                    trainer="vision"))
        l1 = d.store.submit(JobSpec("l1", TOY + ("--rate", "2000"), 1, 1, scaling={1: 100.0}, trainer="lm"))
        v2 = d.store.submit(JobSpec("v2", TOY + ("--rate", "2000"), 1, 1, scaling={1: 100.0}, trainer="vision"))
        home = {v1: {"node00", "node01"}, v2: {"node00", "node01"}, l1: {"node02", "node03"}}

        def never_crossing() -> None:
            for jid, nodes in home.items():
                run = d.runs.get(jid)
                if run is not None:
                    assert set(d.decide.nodes_of(jid)) | set(run.members) | set(run.workers) <= nodes, (jid, run)

        until(d, lambda: len(d.runs[v1].members) == 2 and len(d.runs[l1].members) == 1
              and d.runs[l1].last_progress > 0 and len(d.scav.usable()) == 4, never_crossing)
        assert sorted(d.runs[v1].members) == ["node00", "node01"] and d.runs[l1].members[0] in home[l1]
        # lm has a free node, the vision trainer's one slot is taken: v2 waits for it
        free = set(d.scav.usable()) - {n for r in d.runs.values() for n in r.members}
        assert free == home[l1] - set(d.runs[l1].members)
        assert d.store.require(v2).state is JobState.PENDING
        assert d.runs[v2].waiting == "all 1 slots are taken (max_running)"
        status = {j["id"]: j["trainer"] for j in d.api.status_jobs()}
        assert status == {v1: "vision", l1: "lm", v2: "vision"}
        d.store.request_cancel(v1)  # the slot frees: v2 runs, on the vision nodes only
        until(d, lambda: len(d.runs[v2].members) == 1, never_crossing)
        assert d.store.require(l1).state is JobState.RUNNING
        assert json.loads(d.store.get_meta(POLICY_STATE_KEY)).keys() == {"vision", "lm"}
    finally:
        d.close()
    assert procs_mentioning(str(tmp_path / "state")) == []
