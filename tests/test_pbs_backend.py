"""PBS backend on what a real OpenPBS 23.06 server printed (``tests/fixtures/pbs/``, recorded by
its ``record.py``; ``roles.json`` names which job is which), and the shared pilot state machine
driven through a scripted qstat/qsub/qdel that replays those jobs."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

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
    PilotQueued,
    PilotRequest,
    PilotStarted,
    PilotState,
    SavedPilot,
    Throttled,
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
CFG = PbsConfig(daemon_address="tcp://head:5555", queue="preemptable", job_name="mt-pilot", ncpus=1,
                renew_before_s=0.0, max_queued_s=600.0)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


ROLES: dict[str, str] = json.loads(fixture("roles.json"))
JOBS: dict[str, dict[str, Any]] = json.loads(fixture("qstat_pilots.json"))["Jobs"]
EDGES: dict[str, dict[str, Any]] = json.loads(fixture("edges.json"))


def job(role: str) -> dict[str, Any]:
    return copy.deepcopy(JOBS[ROLES[role]])


def res(argv, stdout="", stderr="", code=0) -> CommandResult:
    return CommandResult(tuple(argv), code, stdout, stderr, 0.01)


def edge(name: str) -> CommandResult:
    e = EDGES[name]
    return res(e["argv"], e["stdout"], e["stderr"], e["returncode"])


def ctime(text: str) -> float:
    return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y").timestamp()


def test_fixtures_are_what_the_real_server_printed() -> None:
    doc = json.loads(fixture("qstat_pilots.json"))
    assert doc["pbs_version"].startswith("23.06")
    nodes = json.loads(fixture("pbsnodes_av.json"))["nodes"]
    assert all(isinstance(n["state"], str) for n in nodes.values())  # one comma-joined string
    assert "jobs" not in nodes["vn5"] and nodes["vn2"]["jobs"]  # absent when empty
    assert "ncpus" not in nodes["vn5"].get("resources_assigned", {})  # zero values dropped
    host = [n for n in nodes if not n.startswith("vn")]
    assert len(host) == 1 and nodes[host[0]]["resources_available"]["ncpus"] == 0  # the MoM's own vnode
    states = {r: JOBS[j]["job_state"] for r, j in ROLES.items() if not r.startswith("prod_")}
    assert {JOBS[j]["queue"] for r, j in ROLES.items() if r.startswith("prod_")} == {"prod"}
    assert states == {"running": "R", "queued": "Q", "held": "H", "requeued": "Q", "deleted": "F",
                      "suspended": "S", "cancelled": "F", "exited": "F", "failed": "F", "walltime": "F"}
    assert job("requeued")["run_count"] == 1 and job("requeued")["Exit_status"] == -11  # back in Q, rerun pending
    assert "exec_vnode" not in job("requeued")
    assert job("deleted")["substate"] == 91 and job("deleted")["comment"].endswith("terminated by Scheduler@vm")
    assert job("cancelled")["substate"] == 91 and "terminated by root@" in job("cancelled")["comment"]
    assert job("deleted")["Exit_status"] == job("cancelled")["Exit_status"]  # only the comment tells them apart
    assert job("walltime")["Exit_status"] == -29 and job("suspended")["substate"] == 45
    assert isinstance(job("running")["stime"], str)  # a ctime string


def test_pbsnodes_vnodes_and_states() -> None:
    assert translate_node_state("free") is NodeState.IDLE
    assert translate_node_state("down,offline") is NodeState.DOWN
    assert translate_node_state("job-busy") is NodeState.BUSY
    assert translate_node_state("free,frobnicated") is NodeState.UNKNOWN
    assert translate_node_state("Stale") is NodeState.DOWN  # a vnode its MoM no longer reports
    d = PbsDialect(CFG)
    assert d.render_nodes() == ["pbsnodes", "-av", "-F", "json"]  # vnodes need -v
    nodes = {n.name: n for n in d.parse_nodes(res(["pbsnodes"], fixture("pbsnodes_av.json")))}
    assert sorted(nodes) == [f"vn{i}" for i in range(6)]  # the host's own vnode (ncpus 0) left out
    assert {n for n, i in nodes.items() if i.holdable} == {"vn5"}
    assert nodes["vn0"].state is NodeState.DOWN and nodes["vn0"].raw == "offline"
    assert {nodes[v].state for v in ("vn1", "vn2", "vn3", "vn4")} == {NodeState.BUSY}


def test_a_free_vnode_with_cpus_assigned_or_in_a_reservation_is_not_idle() -> None:
    doc = json.loads(fixture("pbsnodes_av.json"))
    free = doc["nodes"]["vn5"]
    doc["nodes"]["vn6"] = dict(free, resources_assigned={"ncpus": 1})  # a shared job runs there
    doc["nodes"]["vn7"] = dict(free, resv="R12.vm")  # in a reservation
    nodes = {n.name: n for n in PbsDialect(CFG).parse_nodes(res(["pbsnodes"], json.dumps(doc)))}
    assert nodes["vn6"].state is NodeState.BUSY
    assert nodes["vn7"].planned and nodes["vn7"].state is NodeState.IDLE and not nodes["vn7"].holdable


def test_bad_pbs_replies_name_what_is_wrong() -> None:
    d = PbsDialect(CFG)
    with pytest.raises(BadReply, match="pbsnodes.*not JSON"):
        d.parse_nodes(res(["pbsnodes"], "pbsnodes: Server has no node list"))
    with pytest.raises(BadReply, match="node 'vn9' has no state"):
        d.parse_nodes(res(["pbsnodes"], json.dumps({"nodes": {"vn9": {"ntype": "PBS"}}})))
    with pytest.raises(CommandFailed, match="pbsnodes.*cannot connect"):
        d.parse_nodes(res(["pbsnodes"], "", "pbsnodes: cannot connect to server vm, error=15010", 1))
    doc = json.loads(fixture("qstat_pilots.json"))
    running = ROLES["running"]
    doc["Jobs"][running]["stime"] = "yesterday"
    with pytest.raises(BadReply, match=f"job {running}: bad PBS time 'yesterday'"):
        d.parse_poll(res(["qstat"], json.dumps(doc)), [PilotId(running)])


def test_qstat_states_vnodes_and_end_reasons() -> None:
    ids = [PilotId(j) for j in JOBS]
    obs = {o.pilot: o for o in PbsDialect(CFG).parse_poll(res(["qstat"], fixture("qstat_pilots.json")), ids)}
    by = {r: obs[PilotId(j)] for r, j in ROLES.items() if j in JOBS}
    run = by["running"]
    assert (run.state, run.nodes) == (PilotState.RUNNING, ("vn2",))  # exec_vnode, not the MoM's host
    assert run.expires_at == ctime(job("running")["stime"]) + 600
    assert by["queued"].state is PilotState.QUEUED and by["held"].state is PilotState.QUEUED
    assert by["requeued"].state is PilotState.QUEUED and by["requeued"].start is None
    assert by["suspended"].state is PilotState.SUSPENDED and by["suspended"].preempted
    reasons = {r: by[r].reason for r in ("deleted", "cancelled", "exited", "failed", "walltime")}
    assert reasons == {"deleted": EndReason.PREEMPTED, "cancelled": EndReason.EXITED,  # ours: the backend knows
                       "exited": EndReason.EXITED, "failed": EndReason.FAILED, "walltime": EndReason.TIMEOUT}
    assert by["deleted"].preempted and not by["cancelled"].preempted  # only the scheduler's delete is sure
    assert set(PBS_STATES) == set("BEFHMQRSTUWX")
    assert parse_exec_host("vm/0+vm/1") == ("vm",) and parse_exec_host("n6/0*8") == ("n6",)
    assert parse_exec_vnode(job("running")["exec_vnode"]) == ("vn2",)
    assert parse_exec_vnode("(n7:ncpus=8)+(n1:ncpus=8)") == ("n7", "n1")


def test_a_job_being_requeued_counts_as_queued_and_an_unknown_letter_as_unknown() -> None:
    d = PbsDialect(CFG)
    pid = PilotId(ROLES["running"])
    for state, substate in (("R", 60), ("E", 61), ("E", 63)):  # the rerun's way back to the queue
        doc = {"Jobs": {pid: dict(job("running"), job_state=state, substate=substate)}}
        assert d.parse_poll(res(["qstat"], json.dumps(doc)), [pid])[0].state is PilotState.QUEUED
    doc = {"Jobs": {pid: dict(job("running"), job_state="E", substate=51)}}  # exiting for good
    assert d.parse_poll(res(["qstat"], json.dumps(doc)), [pid])[0].state is PilotState.ENDING
    doc = {"Jobs": {pid: dict(job("running"), job_state="Z")}}
    assert d.parse_poll(res(["qstat"], json.dumps(doc)), [pid])[0].state is PilotState.UNKNOWN


def test_claims_from_estimated_start() -> None:
    """A queued main-queue job with the scheduler's estimate (``estimated`` is set only for the
    top jobs of a server with strict ordering and backfill; the rest is the real server's job)."""
    d = PbsDialect(CFG)
    assert d.parse_claims(res(["qstat"], fixture("qstat_all.json"))) == ()  # no estimates there
    doc = json.loads(fixture("qstat_all.json"))
    main = dict(job("queued"), Job_Name="prod", queue="prod",
                estimated={"exec_vnode": "(vn5:ncpus=1)+(vn1:ncpus=1)", "start_time": "Thu Nov 26 18:30:00 2026"})
    doc["Jobs"] = {"900.vm": main, ROLES["queued"]: dict(job("queued"), estimated=main["estimated"])}
    claims = d.parse_claims(res(["qstat"], json.dumps(doc)))
    assert [(c.job, c.nodes, c.start) for c in claims] == [
        ("900.vm", ("vn5", "vn1"), ctime("Thu Nov 26 18:30:00 2026"))  # our own pilot is no claim
    ]


def test_qsub_and_qdel_argv_and_the_real_edges() -> None:
    d = PbsDialect(CFG)
    argv = d.render_submit(PilotRequest(("vn3",), after=PilotId("7.vm")), 3600)
    assert argv[:5] == ["qsub", "-N", "mt-pilot", "-q", "preemptable"]
    for pair in (["-r", "y"], ["-l", "select=1:ncpus=1:vnode=vn3"], ["-l", "place=scatter:excl"],
                 ["-l", "walltime=01:00:00"], ["-W", "depend=afterany:7.vm"]):
        i = argv.index(pair[1])
        assert argv[i - 1] == pair[0]
    tail = argv[argv.index("--") + 1:]
    assert tail[1:] == ["-m", "scavenger.agent", "--node", "vn3", "--daemon", "tcp://head:5555"]
    assert job("running")["Resource_List"]["select"] == "1:ncpus=1:vnode=vn2"  # what the server was given
    assert job("running")["Rerunable"] == "True"
    cfg2 = PbsConfig(daemon_address="tcp://h:1", queue="q", nodes_per_pilot=2)
    multi = PbsDialect(cfg2).render_submit(PilotRequest(("n1", "n2")), 90)
    assert "select=1:ncpus=1:vnode=n1+1:ncpus=1:vnode=n2" in multi and multi[multi.index("--") + 1] == "pbsdsh"
    assert format_walltime(90) == "00:01:30"
    assert d.parse_submit(res(argv, f"{ROLES['running']}\n")) == ROLES["running"]
    with pytest.raises(BadReply, match="qsub"):
        d.parse_submit(res(argv, "qsub: would exceed queue preemptable's per-user limit\n"))
    assert d.render_cancel([PilotId("1.vm"), PilotId("2.vm")]) == ["qdel", "1.vm", "2.vm"]
    qdel = edge("qdel_finished")
    assert qdel.returncode == 35
    d.check_cancel(qdel)  # already gone: fine
    with pytest.raises(CommandFailed, match="qdel"):
        d.check_cancel(res(["qdel"], "", "qdel: Unauthorized Request  1.vm", 159))


def test_unknown_and_finished_jobs_as_the_real_server_answers() -> None:
    d = PbsDialect(CFG)
    unknown = edge("qstat_unknown")
    assert unknown.returncode == 153 and "Unknown Job Id" in unknown.stderr
    assert d.parse_detail(unknown, PilotId("99999.vm")) is None
    two = edge("qstat_two_ids")  # -F json prints only the first of several ids: polls ask for all jobs
    assert list(json.loads(two.stdout)["Jobs"]) == [ROLES["running"]]
    assert d.render_poll([PilotId(ROLES["running"]), PilotId(ROLES["queued"])]) == ["qstat", "-f", "-F", "json"]
    assert d.render_detail(PilotId(ROLES["running"])) == ["qstat", "-x", "-f", "-F", "json", ROLES["running"]]
    wanted = [PilotId(ROLES["running"]), PilotId(ROLES["exited"])]
    live = d.parse_poll(res(["qstat"], fixture("qstat_all.json")), wanted)
    assert [(o.pilot, o.state) for o in live] == [(ROLES["running"], PilotState.RUNNING)]  # finished: not there
    finished = edge("qstat_finished_without_x")
    assert "Jobs" not in json.loads(finished.stdout)  # -f without -x: a finished job is left out
    assert d.parse_poll(finished, [PilotId(ROLES["exited"])]) == []
    assert edge("pbsnodes_vnode_without_v").returncode != 0  # hence pbsnodes -av


class FakePbs:
    """qsub/qstat/qdel over the real jobs; tests move a pilot with ``become(pilot, role)``."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict] = {}
        self.next_id = 300
        self.calls: list[tuple[str, ...]] = []
        self.qsub_error = ""

    def __call__(self, argv, timeout, check, env) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        return getattr(self, argv[0])(argv)

    def qsub(self, argv):
        if self.qsub_error:
            return res(argv, "", self.qsub_error, 15)
        jid = f"{self.next_id}.vm"
        self.next_id += 1
        self.jobs[jid] = job("queued")
        return res(argv, jid + "\n")

    def become(self, jid: str, role: str, **changes: Any) -> None:
        self.jobs[jid] = dict(job(role), **changes)

    def qstat(self, argv):
        ids = [a for a in argv[1:] if not a.startswith("-") and a not in ("json",)]
        if not ids:  # every unfinished job
            ids = [j for j, a in self.jobs.items() if a["job_state"] != "F"]
        known = {j: self.jobs[j] for j in ids if j in self.jobs}
        unknown = [j for j in ids if j not in self.jobs]
        err = "".join(f"qstat: Unknown Job Id {j}\n" for j in unknown)
        doc = {"timestamp": 1, "pbs_version": "23.06.06", "pbs_server": "vm", "Jobs": known}
        out = json.dumps(doc) if known else ""
        return res(argv, out, err, 153 if unknown else 0)

    def qdel(self, argv):
        for jid in argv[1:]:
            if jid in self.jobs and self.jobs[jid]["job_state"] != "F":
                self.jobs[jid] = job("cancelled")  # Exit_status 271, "terminated by root@vm"
        return res(argv)


def make(**cfg: Any) -> tuple[FakePbs, PbsBackend]:
    fake = FakePbs()
    now = [ctime(job("running")["stime"]) + 60.0]
    b = PbsBackend(PbsConfig(**{**CFG.__dict__, **cfg}), clock=lambda: now[0], runner=fake)
    b.now = now  # type: ignore[attr-defined]
    return fake, b


def test_suspended_pilot_is_a_recall_and_the_backend_qdels_it() -> None:
    fake, b = make()
    p = b.submit(PilotRequest(("vn4",)))
    fake.become(p, "running")
    assert any(isinstance(e, PilotStarted) for e in b.poll())
    fake.become(p, "suspended")  # preempt_order S: SIGSTOPped, keeps the vnode
    evs = b.poll()
    assert [e.reason for e in evs if isinstance(e, PilotEnding)] == [EndReason.PREEMPTED]
    assert ("qdel", p) in fake.calls
    ended = [e for e in b.poll() if isinstance(e, PilotEnded)]
    assert [(e.pilot, e.reason) for e in ended] == [(p, EndReason.PREEMPTED)]  # our qdel was the recall's


def test_pbs_end_reasons_through_the_shared_machine() -> None:
    fake, b = make()
    ids = [b.submit(PilotRequest((n,))) for n in ("vn1", "vn2", "vn3", "vn4", "vn5")]
    for jid in ids:
        fake.become(jid, "running")
    b.poll()
    b.cancel(ids[0])  # ours: SIGTERM exit, but we asked for it
    fake.become(ids[1], "walltime")
    fake.become(ids[2], "deleted")  # preempt_order D
    fake.become(ids[3], "failed")
    del fake.jobs[ids[4]]  # history off: the server forgot it
    ended = {e.pilot: e.reason for e in b.poll() if isinstance(e, PilotEnded)}
    assert ended == {ids[0]: EndReason.CANCELLED, ids[1]: EndReason.TIMEOUT, ids[2]: EndReason.PREEMPTED,
                     ids[3]: EndReason.FAILED, ids[4]: EndReason.UNKNOWN}
    polls = [c for c in fake.calls if c == ("qstat", "-f", "-F", "json")]
    lookups = [c for c in fake.calls if c[:2] == ("qstat", "-x")]
    assert len(polls) == 2 and len(lookups) == 5  # one query per poll, one lookup per pilot gone from it


def test_a_scheduler_delete_after_our_own_cancel_is_still_a_preemption() -> None:
    fake, b = make()
    p = b.submit(PilotRequest(("vn1",)))
    fake.become(p, "running")
    b.poll()
    b.cancel(p)
    fake.become(p, "deleted")  # the scheduler was first: its comment says so
    assert [(e.pilot, e.reason) for e in b.poll() if isinstance(e, PilotEnded)] == [(p, EndReason.PREEMPTED)]


def test_a_requeued_pilot_is_reported_and_held_again_when_it_reruns() -> None:
    """preempt_order R: R -> (R/E rerun substates) -> Q -> R again, on its vnode: the backend says
    requeued once, never ended, and started again; the same pilot id throughout."""
    fake, b = make()
    p = b.submit(PilotRequest(("vn3",)))
    fake.become(p, "running")
    assert [type(e) for e in b.poll()] == [PilotQueued, PilotStarted]
    fake.become(p, "running", job_state="E", substate=61)
    evs = b.poll()
    assert evs == [PilotQueued(p, ("vn2",), requeued=True)]  # the node of its exec_vnode, now lost
    assert b.pilots()[p].state is PilotState.QUEUED
    fake.become(p, "requeued")
    assert b.poll() == []
    fake.become(p, "running")
    evs = b.poll()
    assert [type(e) for e in evs] == [PilotStarted] and b.pilots()[p].state is PilotState.RUNNING
    assert not any(c[0] == "qdel" for c in fake.calls) and fake.next_id == 301  # nothing cancelled, no new qsub


def test_a_requeued_pilot_waiting_past_max_queued_is_cancelled() -> None:
    fake, b = make(max_queued_s=30.0)
    p = b.submit(PilotRequest(("vn3",)))
    fake.become(p, "running")
    b.poll()
    fake.become(p, "requeued")
    b.poll()
    b.now[0] += 20  # type: ignore[attr-defined]
    b.poll()
    assert ("qdel", p) not in fake.calls
    b.now[0] += 15  # type: ignore[attr-defined]
    b.poll()
    assert ("qdel", p) in fake.calls
    fake.jobs[p] = job("cancelled")
    assert [(e.pilot, e.reason) for e in b.poll() if isinstance(e, PilotEnded)] == [(p, EndReason.CANCELLED)]


def test_qstat_failure_is_typed_and_unknown_ids_are_not_an_error() -> None:
    fake, b = make()
    p = b.submit(PilotRequest(("vn1",)))
    b.runner = lambda argv, timeout, check, env: res(argv, "", "qstat: cannot connect to server vm (errno=15010)", 2)
    with pytest.raises(CommandFailed, match="qstat.*cannot connect"):
        b.poll()
    assert b.pilots()[p].state is PilotState.QUEUED
    b.runner = lambda argv, timeout, check, env: res(argv, "{not json", "", 0)
    with pytest.raises(BadReply, match="qstat.*not JSON"):
        b.poll()
    b.runner = fake
    assert [e.pilot for e in b.poll()] == [p]  # the queued event was kept through the failures
    q = b.submit(PilotRequest(("vn5",)))
    fake.become(p, "running")
    del fake.jobs[q]  # qstat exits 153 with "Unknown Job Id" for q and still lists p
    evs = b.poll()
    assert PilotEnded(q, ("vn5",), EndReason.UNKNOWN, "the scheduler no longer knows this job") in evs
    assert any(isinstance(e, PilotStarted) and e.pilot == p for e in evs)


def test_walltime_renewal_queues_a_dependent_replacement_on_the_same_vnode() -> None:
    fake, b = make(renew_before_s=120.0)
    p = b.submit(PilotRequest(("vn2",)))
    fake.become(p, "running")
    b.poll()
    b.now[0] = ctime(job("running")["stime"]) + 600 - 100  # type: ignore[attr-defined]
    evs = b.poll()
    assert [e.reason for e in evs if isinstance(e, PilotEnding)] == [EndReason.TIMEOUT]
    repl = [c for c in fake.calls if c[0] == "qsub"][-1]
    assert "depend=afterany:" + p in repl and "select=1:ncpus=1:vnode=vn2" in repl
    new = next(v.id for v in b.pilots().values() if v.replaces == p)
    fake.become(new, "held")
    fake.become(p, "walltime")
    assert [(e.pilot, e.reason) for e in b.poll() if isinstance(e, PilotEnded)] == [(p, EndReason.TIMEOUT)]
    fake.become(new, "running")
    assert [e.pilot for e in b.poll() if isinstance(e, PilotStarted)] == [new]


def test_a_restarted_backend_takes_back_queued_requeued_and_running_pilots() -> None:
    fake, b = make()
    ids = {"queued": "11.vm", "requeued": "12.vm", "running": "13.vm", "gone": "14.vm"}
    for role, jid in ids.items():
        if role != "gone":
            fake.become(jid, role)
    b.resume([SavedPilot(PilotId(j), (f"vn{i}",)) for i, j in enumerate(ids.values())])
    assert len(b.pilots()) == 4 and {v.state for v in b.pilots().values()} == {PilotState.UNKNOWN}
    evs = b.poll()
    assert [(e.pilot, e.reason) for e in evs if isinstance(e, PilotEnded)] == [("14.vm", EndReason.UNKNOWN)]
    assert {p: v.state for p, v in b.pilots().items()} == {
        "11.vm": PilotState.QUEUED, "12.vm": PilotState.QUEUED, "13.vm": PilotState.RUNNING}
    assert not any(c[0] == "qsub" for c in fake.calls)
    _, capped = make(max_pilots=1)
    capped.resume([SavedPilot(PilotId("1.vm"), ("vn0",))])
    with pytest.raises(Throttled):
        capped.submit(PilotRequest(("vn1",)))  # the taken-back pilot counts towards the cap


def test_a_rejected_qsub_raises_and_backs_off() -> None:
    fake, b = make()
    fake.qsub_error = "qsub: Unknown queue"
    with pytest.raises(CommandFailed, match="qsub.*Unknown queue"):
        b.submit(PilotRequest(("vn1",)))
    fake.qsub_error = ""
    with pytest.raises(Throttled):
        b.submit(PilotRequest(("vn1",)))  # backing off
    b.now[0] += 1.5  # type: ignore[attr-defined]
    assert b.submit(PilotRequest(("vn1",))) == "300.vm"


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="daemon_address"):
        PbsBackend(PbsConfig(queue="q"))
    with pytest.raises(ValueError, match="queue"):
        PbsBackend(PbsConfig(daemon_address="tcp://h:1", queue=""))
    with pytest.raises(ValueError, match="job_name"):
        PbsBackend(PbsConfig(daemon_address="tcp://h:1", queue="q", job_name="1-bad"))
