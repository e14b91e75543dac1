"""PBS backend on fixtures that follow OpenPBS's JSON encoder (OpenPBS cannot be installed here),
and the same shared pilot state machine as Slurm, driven through a scripted qstat/qsub/qdel."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path

import pytest

from scavenger.base import (
    BadReply,
    CommandFailed,
    CommandResult,
    EndReason,
    NodeState,
    PilotEnded,
    PilotEnding,
    PilotId,
    PilotRequest,
    PilotStarted,
    PilotState,
)
from scavenger.pbs import (
    PBS_STATES,
    PbsBackend,
    PbsConfig,
    PbsDialect,
    format_walltime,
    parse_exec_host,
    parse_exec_vnode,
    translate_node_state,
)

FIXTURES = Path(__file__).parent / "fixtures" / "pbs"
CFG = PbsConfig(daemon_address="tcp://head:5555", queue="preempt", job_name="mt-pilot", ncpus=8,
                renew_before_s=0.0, max_queued_s=600.0)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def res(argv, stdout="", stderr="", code=0) -> CommandResult:
    return CommandResult(tuple(argv), code, stdout, stderr, 0.01)


def ctime(text: str) -> float:
    return datetime.strptime(text, "%a %b %d %H:%M:%S %Y").timestamp()


def test_fixtures_follow_the_encoder() -> None:
    nodes = json.loads(fixture("pbsnodes_a.json"))["nodes"]
    assert all(isinstance(n["state"], str) for n in nodes.values())  # one comma-joined string
    assert "jobs" not in nodes["n1"] and nodes["n2"]["jobs"] == ["101.pbs01"]  # absent when empty
    assert nodes["n1"]["resources_assigned"] == {}  # zero values dropped
    assert isinstance(nodes["n1"]["pcpus"], int)  # numeric strings became numbers
    jobs = json.loads(fixture("qstat_pilots.json"))["Jobs"]
    assert {j["job_state"] for j in jobs.values()} <= set("BEFHMQRSTUWX") | {"Z"}  # Z: a letter we do not know
    assert jobs["205.pbs01"]["Exit_status"] == -29


def test_pbsnodes_states() -> None:
    assert translate_node_state("free") is NodeState.IDLE
    assert translate_node_state("down,offline") is NodeState.DOWN
    assert translate_node_state("job-busy") is NodeState.BUSY
    assert translate_node_state("free,frobnicated") is NodeState.UNKNOWN
    nodes = {n.name: n for n in PbsDialect(CFG).parse_nodes(res(["pbsnodes"], fixture("pbsnodes_a.json")))}
    assert {n for n, i in nodes.items() if i.holdable} == {"n1", "n7"}
    assert nodes["n4"].planned and nodes["n4"].state is NodeState.IDLE  # in a reservation
    assert nodes["n5"].state is NodeState.BUSY  # free, but a shared job runs there
    assert nodes["n3"].state is NodeState.DOWN and nodes["n3"].raw == "down,offline"
    assert nodes["n8"].state is NodeState.DOWN


def test_bad_pbs_replies_name_what_is_wrong() -> None:
    d = PbsDialect(CFG)
    with pytest.raises(BadReply, match="pbsnodes.*not JSON"):
        d.parse_nodes(res(["pbsnodes"], "pbsnodes: Server has no node list"))
    with pytest.raises(BadReply, match="node 'n9' has no state"):
        d.parse_nodes(res(["pbsnodes"], json.dumps({"nodes": {"n9": {"ntype": "PBS"}}})))
    with pytest.raises(CommandFailed, match="pbsnodes.*cannot connect"):
        d.parse_nodes(res(["pbsnodes"], "", "pbsnodes: cannot connect to server pbs01, error=15010", 1))
    doc = json.loads(fixture("qstat_pilots.json"))
    doc["Jobs"]["201.pbs01"]["stime"] = "yesterday"
    with pytest.raises(BadReply, match="job 201.pbs01: bad PBS time 'yesterday'"):
        d.parse_poll(res(["qstat"], json.dumps(doc)), [PilotId("201.pbs01")])


def test_qstat_states_nodes_and_end_reasons() -> None:
    ids = [PilotId(j) for j in json.loads(fixture("qstat_pilots.json"))["Jobs"]]
    obs = {o.pilot: o for o in PbsDialect(CFG).parse_poll(res(["qstat"], fixture("qstat_pilots.json")), ids)}
    run = obs[PilotId("201.pbs01")]
    assert (run.state, run.nodes) == (PilotState.RUNNING, ("n6",))
    assert run.expires_at == ctime("Tue Nov 24 17:00:00 2026") + 3600
    assert obs[PilotId("202.pbs01")].state is PilotState.QUEUED
    assert obs[PilotId("203.pbs01")].state is PilotState.SUSPENDED and obs[PilotId("203.pbs01")].preempted
    assert obs[PilotId("204.pbs01")].state is PilotState.ENDING
    reasons = {p: obs[PilotId(p)].reason for p in ("205.pbs01", "206.pbs01", "207.pbs01", "208.pbs01")}
    assert reasons == {"205.pbs01": EndReason.TIMEOUT, "206.pbs01": EndReason.PREEMPTED,
                       "207.pbs01": EndReason.EXITED, "208.pbs01": EndReason.FAILED}
    assert obs[PilotId("209.pbs01")].state is PilotState.QUEUED  # held
    assert obs[PilotId("210.pbs01")].state is PilotState.QUEUED  # waiting on its dependency
    assert obs[PilotId("211.pbs01")].state is PilotState.UNKNOWN
    assert set(PBS_STATES) == set("BEFHMQRSTUWX")
    assert parse_exec_host("n1/0+n2/0") == ("n1", "n2") and parse_exec_host("n6/0*8") == ("n6",)
    assert parse_exec_vnode("(n7:ncpus=8)+(n1:ncpus=8)") == ("n7", "n1")


def test_claims_from_estimated_start() -> None:
    claims = PbsDialect(CFG).parse_claims(res(["qstat"], fixture("qstat_all.json")))
    assert [(c.job, c.nodes, c.start) for c in claims] == [
        ("103.pbs01", ("n7", "n1"), ctime("Tue Nov 24 18:30:00 2026"))
    ]


def test_qsub_and_qdel_argv() -> None:
    d = PbsDialect(CFG)
    argv = d.render_submit(PilotRequest(("n7",), after=PilotId("201.pbs01")), 3600)
    assert argv[:5] == ["qsub", "-N", "mt-pilot", "-q", "preempt"]
    for pair in (["-r", "y"], ["-l", "select=1:ncpus=8:vnode=n7"], ["-l", "place=scatter:excl"],
                 ["-l", "walltime=01:00:00"], ["-W", "depend=afterany:201.pbs01"]):
        i = argv.index(pair[1])
        assert argv[i - 1] == pair[0]
    tail = argv[argv.index("--") + 1:]
    assert tail[1:] == ["-m", "scavenger.agent", "--node", "n7", "--daemon", "tcp://head:5555"]
    cfg2 = PbsConfig(daemon_address="tcp://h:1", nodes_per_pilot=2)
    multi = PbsDialect(cfg2).render_submit(PilotRequest(("n1", "n2")), 90)
    assert "select=1:ncpus=1:vnode=n1+1:ncpus=1:vnode=n2" in multi and multi[multi.index("--") + 1] == "pbsdsh"
    assert format_walltime(90) == "00:01:30"
    assert d.parse_submit(res(argv, "1234.pbs01\n")) == "1234.pbs01"
    with pytest.raises(BadReply, match="qsub"):
        d.parse_submit(res(argv, "qsub: would exceed queue preempt's per-user limit\n"))
    assert d.render_cancel([PilotId("1.pbs01"), PilotId("2.pbs01")]) == ["qdel", "1.pbs01", "2.pbs01"]
    d.check_cancel(res(["qdel"], "", "qdel: Job has finished 1.pbs01", 35))  # already gone: fine
    with pytest.raises(CommandFailed, match="qdel"):
        d.check_cancel(res(["qdel"], "", "qdel: Unauthorized Request  1.pbs01", 159))


class FakePbs:
    """qsub/qstat/qdel over the fixture's jobs; tests edit ``self.jobs`` to move them."""

    def __init__(self) -> None:
        template = json.loads(fixture("qstat_pilots.json"))["Jobs"]
        self.template = template
        self.jobs: dict[str, dict] = {}
        self.next_id = 300
        self.calls: list[tuple[str, ...]] = []
        self.qdel_exit = 271  # what a SIGTERMed agent's job reports

    def __call__(self, argv, timeout, check, env) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        return getattr(self, argv[0])(argv)

    def qsub(self, argv):
        jid = f"{self.next_id}.pbs01"
        self.next_id += 1
        self.jobs[jid] = copy.deepcopy(self.template["202.pbs01"])  # a queued pilot
        return res(argv, jid + "\n")

    def become(self, jid: str, like: str) -> None:
        self.jobs[jid] = copy.deepcopy(self.template[like])

    def qstat(self, argv):
        ids = [a for a in argv[1:] if not a.startswith("-") and a not in ("json",)]
        known = {j: self.jobs[j] for j in ids if j in self.jobs}
        unknown = [j for j in ids if j not in self.jobs]
        err = "".join(f"qstat: Unknown Job Id {j}\n" for j in unknown)
        out = json.dumps({"timestamp": 1, "pbs_version": "2022.1.1", "pbs_server": "pbs01", "Jobs": known}) if known else ""
        return res(argv, out, err, 153 if unknown else 0)

    def qdel(self, argv):
        for jid in argv[1:]:
            if jid in self.jobs and self.jobs[jid]["job_state"] != "F":
                self.jobs[jid] = copy.deepcopy(self.template["206.pbs01"])
                self.jobs[jid]["Exit_status"] = self.qdel_exit
        return res(argv)


def make():
    fake = FakePbs()
    return fake, PbsBackend(CFG, clock=lambda: ctime("Tue Nov 24 17:10:00 2026"), runner=fake)


def test_suspended_pilot_is_a_recall_and_the_backend_qdels_it() -> None:
    fake, b = make()
    p = b.submit(PilotRequest(("n2",)))
    fake.become(p, "201.pbs01")
    assert any(isinstance(e, PilotStarted) for e in b.poll())
    fake.become(p, "203.pbs01")  # preempted by suspension: SIGSTOPped, keeps the node
    evs = b.poll()
    assert [e.reason for e in evs if isinstance(e, PilotEnding)] == [EndReason.PREEMPTED]
    assert ("qdel", p) in fake.calls
    ended = [e for e in b.poll() if isinstance(e, PilotEnded)]
    assert [(e.pilot, e.reason) for e in ended] == [(p, EndReason.PREEMPTED)]  # our qdel was the recall's


def test_pbs_end_reasons_through_the_shared_machine() -> None:
    fake, b = make()
    ids = [b.submit(PilotRequest((n,))) for n in ("n1", "n4", "n5", "n7")]
    for jid in ids:
        fake.become(jid, "201.pbs01")
    b.poll()
    b.cancel(ids[0])  # ours: SIGTERM exit, but we asked for it
    fake.become(ids[1], "205.pbs01")  # walltime
    fake.become(ids[2], "206.pbs01")  # SIGTERM we did not send: preempted (preempt_order D/R)
    del fake.jobs[ids[3]]  # history off: the server forgot it
    ended = {e.pilot: e.reason for e in b.poll() if isinstance(e, PilotEnded)}
    assert ended == {ids[0]: EndReason.CANCELLED, ids[1]: EndReason.TIMEOUT, ids[2]: EndReason.PREEMPTED,
                     ids[3]: EndReason.UNKNOWN}
    assert sum(1 for c in fake.calls if c[:2] == ("qstat", "-f")) == 1 + 1 + 1  # batched: one per poll + one lookup


def test_qstat_failure_is_typed_and_unknown_ids_are_not_an_error() -> None:
    fake, b = make()
    p = b.submit(PilotRequest(("n1",)))
    b.runner = lambda argv, timeout, check, env: res(argv, "", "qstat: cannot connect to server pbs01 (errno=15010)", 2)
    with pytest.raises(CommandFailed, match="qstat.*cannot connect"):
        b.poll()
    assert b.pilots()[p].state is PilotState.QUEUED
    b.runner = lambda argv, timeout, check, env: res(argv, "{not json", "", 0)
    with pytest.raises(BadReply, match="qstat.*not JSON"):
        b.poll()
    b.runner = fake
    assert [e.pilot for e in b.poll()] == [p]  # the queued event was kept through the failures
    q = b.submit(PilotRequest(("n7",)))
    fake.become(p, "201.pbs01")
    del fake.jobs[q]  # qstat exits 153 with "Unknown Job Id" for q and still lists p
    evs = b.poll()
    assert PilotEnded(q, ("n7",), EndReason.UNKNOWN, "the scheduler no longer knows this job") in evs
    assert any(isinstance(e, PilotStarted) and e.pilot == p for e in evs)
