"""Slurm backend without a cluster: parsers on real 22.05 replies, argv, and the shared
pilot state machine driven through a scripted scheduler."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from scavenger.base import (
    TRANSITIONS,
    AgentRoster,
    BadReply,
    CommandFailed,
    CommandResult,
    CommandTimeout,
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
    can_move,
)
from malletrain.daemon.scavenging import REQUEUE_AFTER_S, Scavenging
from scavenger.pilots import SubmitLimiter
from scavenger.slurm import (
    SLURM_STATES,
    SlurmBackend,
    SlurmConfig,
    SlurmDialect,
    expand_hostlist,
    parse_duration,
    parse_scontrol_record,
    parse_squeue_line,
    translate_node_state,
)


def res(argv, stdout="", stderr="", code=0) -> CommandResult:
    return CommandResult(tuple(argv), code, stdout, stderr, 0.01)


def ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()


CFG = SlurmConfig(daemon_address="tcp://head:5555", job_name="mt-pilot", renew_before_s=60.0, max_queued_s=30.0)

# Replies as Debian's Slurm 22.05 printed them on the test cluster.
SINFO_PLANNED = "node1|allocated\nnode2|planned\nnode3|planned\nnode4|idle\nnode5|idle*\nnode6|mixed-\n"
SQUEUE_GRACE = "2|preemptable|RUNNING|None|node2|2026-11-24T17:21:51|2026-11-24T17:22:01|5:00\n"
SQUEUE_TIMEOUT = "10|preemptable|TIMEOUT|TimeLimit|node3|2026-11-24T17:23:31|2026-11-24T17:24:48|1:00\n"
SCONTROL_PREEMPTED = (
    "JobId=6 JobName=mt-pilot UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=0 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:02 TimeLimit=00:05:00 TimeMin=N/A "
    "SubmitTime=2026-11-24T17:23:06 EligibleTime=2026-11-24T17:23:06 StartTime=2026-11-24T17:23:07 "
    "EndTime=2026-11-24T17:23:09 Deadline=N/A PreemptEligibleTime=2026-11-24T17:23:07 "
    "PreemptTime=2026-11-24T17:23:09 SuspendTime=None SecsPreSuspend=0 Partition=preemptable "
    "AllocNode:Sid=localhost:3156 ReqNodeList=node2 NodeList=node2 BatchHost=node2 NumNodes=1 "
    "Command=/tmp/my dir/pilot.sh WorkDir=/home/alice/runs Comment=a comment with spaces Power="
)


# ---- pure parsers ----------------------------------------------------------------------------


def test_node_states_idle_means_idle_without_planned() -> None:
    assert translate_node_state("idle") == (NodeState.IDLE, False)
    assert translate_node_state("planned") == (NodeState.IDLE, True)
    assert translate_node_state("idle*")[0] is NodeState.DOWN  # not responding
    assert translate_node_state("idle~")[0] is NodeState.DOWN  # powered off
    assert translate_node_state("mixed-") == (NodeState.BUSY, True)
    assert translate_node_state("idle$")[0] is NodeState.BUSY  # maintenance reservation
    assert translate_node_state("frobnicated")[0] is NodeState.UNKNOWN
    nodes = SlurmDialect(CFG).parse_nodes(res(["sinfo"], SINFO_PLANNED))
    assert [n.name for n in nodes if n.holdable] == ["node4"]
    assert {n.name for n in nodes if n.planned} == {"node2", "node3", "node6"}


def test_bad_sinfo_reply_names_the_line_and_command() -> None:
    d = SlurmDialect(CFG)
    with pytest.raises(BadReply, match="sinfo line 2") as info:
        d.parse_nodes(res(["sinfo"], "node1|idle\ngarbage\n"))
    assert info.value.result is not None and info.value.result.stdout.endswith("garbage\n")
    with pytest.raises(CommandFailed, match="sinfo.*exited 1.*Unable to contact"):
        d.parse_nodes(res(["sinfo"], "", "sinfo: error: Unable to contact slurm controller", 1))


def test_host_lists_and_durations() -> None:
    assert expand_hostlist("node[1-3,7],gpu01") == ("node1", "node2", "node3", "node7", "gpu01")
    assert expand_hostlist("n[08-10]") == ("n08", "n09", "n10")
    assert expand_hostlist("") is None and expand_hostlist("(null)") is None  # unset
    with pytest.raises(ValueError, match="bad host list"):
        expand_hostlist("n[1-x]")
    assert parse_duration("5:00") == 300 and parse_duration("1-02:00:00") == 93600
    assert parse_duration("UNLIMITED") is None and parse_duration("INVALID") is None


def test_squeue_tells_grace_time_timeout_and_pending() -> None:
    d = SlurmDialect(CFG)
    grace = parse_squeue_line(SQUEUE_GRACE.strip(), res(["squeue"]), 1)
    assert grace.state is PilotState.ENDING and grace.preempted is True
    assert grace.deadline == ts("2026-11-24T17:22:01")
    timeout = parse_squeue_line(SQUEUE_TIMEOUT.strip(), res(["squeue"]), 1)
    assert (timeout.state, timeout.reason) == (PilotState.ENDED, EndReason.TIMEOUT)
    pending = parse_squeue_line("11|preemptable|PENDING|Dependency||N/A|N/A|1:00", res(["squeue"]), 1)
    assert pending.state is PilotState.QUEUED and pending.nodes == ()
    odd = parse_squeue_line("12|p|WEIRD_NEW_STATE|None|node1|N/A|N/A|1:00", res(["squeue"]), 1)
    assert odd.state is PilotState.UNKNOWN
    with pytest.raises(BadReply, match="squeue line 3"):
        d.parse_poll(res(["squeue"], SQUEUE_GRACE + SQUEUE_TIMEOUT + "1|2|3\n"), [PilotId("2")])


def test_scontrol_values_with_spaces_and_preempt_time() -> None:
    rec = parse_scontrol_record(SCONTROL_PREEMPTED)
    assert rec["Command"] == "/tmp/my dir/pilot.sh" and rec["Comment"] == "a comment with spaces"
    assert rec["AllocNode:Sid"] == "localhost:3156" and rec["Power"] == ""
    d = SlurmDialect(CFG)
    obs = d.parse_detail(res(["scontrol"], SCONTROL_PREEMPTED + "\n"), PilotId("6"))
    assert obs is not None and obs.preempted is True and obs.state is PilotState.ENDED
    gone = res(["scontrol"], "", "slurm_load_jobs error: Invalid job id specified", 1)
    assert d.parse_detail(gone, PilotId("6")) is None
    with pytest.raises(BadReply, match="JobId=7"):
        d.parse_detail(res(["scontrol"], SCONTROL_PREEMPTED), PilotId("7"))


def test_sbatch_argv_is_a_preemptable_exclusive_non_requeued_pilot() -> None:
    cfg = SlurmConfig(daemon_address="tcp://head:5555", partition="scavenge", qos="low", account="proj",
                      walltime_s=3601, job_name="mt-pilot")
    argv = SlurmDialect(cfg).render_submit(PilotRequest(("node3",), after=PilotId("41")), 3601)
    for flag in ("--partition=scavenge", "--qos=low", "--account=proj", "--no-requeue", "--exclusive",
                 "--time=61", "--nodelist=node3", "--dependency=afterany:41", "--nodes=1", "--parsable"):
        assert flag in argv
    wrap = argv[argv.index("--wrap") + 1]
    assert wrap.startswith("exec srun ") and "scavenger.agent" in wrap and "$SLURMD_NODENAME" in wrap
    assert "tcp://head:5555" in wrap
    assert SlurmDialect(cfg).parse_submit(res(argv, "42;cluster\n")) == "42"
    with pytest.raises(BadReply, match="sbatch"):
        SlurmDialect(cfg).parse_submit(res(argv, "Submitted batch job 42\n"))
    with pytest.raises(ValueError, match="partition or QOS"):
        SlurmBackend(SlurmConfig(daemon_address="x", partition=None))


def test_every_slurm_state_has_a_pilot_state_and_moves_follow_one_table() -> None:
    assert {s for s, _ in SLURM_STATES.values()} <= set(PilotState)
    assert all(can_move(PilotState.ENDED, s) is (s is PilotState.ENDED) for s in PilotState)
    assert PilotState.RUNNING in TRANSITIONS[PilotState.QUEUED]
    assert PilotState.RUNNING not in TRANSITIONS[PilotState.ENDING]


# ---- the backend against a scripted scheduler ---------------------------------------------------


class FakeSlurm:
    """A scripted Slurm: jobs with states; sinfo/squeue/scontrol/sbatch/scancel as argv."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, str]] = {}
        self.nodes = {"node1": "idle", "node2": "idle", "node3": "planned"}
        self.next_id = 100
        self.calls: list[tuple[str, ...]] = []
        self.fail: dict[str, CommandResult | Exception] = {}

    def __call__(self, argv, timeout, check, env) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        if argv[0] in self.fail:
            f = self.fail[argv[0]]
            if isinstance(f, Exception):
                raise f
            return f
        return getattr(self, argv[0])(argv)

    def sinfo(self, argv):
        return res(argv, "".join(f"{n}|{s}\n" for n, s in self.nodes.items()))

    def squeue(self, argv):
        if "--start" in argv:
            return res(argv, "77|prod|big|2030-01-01T00:00:00|node3\n")
        lines = []
        for jid, j in self.jobs.items():
            if j.get("forgotten"):
                continue
            lines.append(f"{jid}|preemptable|{j['state']}|None|{j.get('node', '')}|{j.get('start', 'N/A')}|"
                         f"{j.get('end', 'N/A')}|{j.get('limit', '60:00')}")
        return res(argv, "\n".join(lines) + "\n")

    def sbatch(self, argv):
        jid = str(self.next_id)
        self.next_id += 1
        node = next(a.split("=", 1)[1] for a in argv if a.startswith("--nodelist="))
        self.jobs[jid] = {"state": "PENDING", "want": node}
        return res(argv, f"{jid}\n")

    def scancel(self, argv):
        for jid in argv[1:]:
            if jid in self.jobs and self.jobs[jid]["state"] in ("PENDING", "RUNNING"):
                self.jobs[jid]["state"] = "CANCELLED"
        return res(argv)

    def scontrol(self, argv):
        jid = argv[-1]
        j = self.jobs.get(jid)
        if j is None or j.get("gone"):
            return res(argv, "", "slurm_load_jobs error: Invalid job id specified", 1)
        return res(argv, f"JobId={jid} JobState={j['state']} PreemptTime={j.get('preempt', 'None')} "
                         f"NodeList={j.get('node', '(null)')} Command=/x y\n")

    def start(self, jid: str, start: str = "2026-11-24T17:00:00", end: str = "2026-11-24T18:00:00") -> None:
        limit = int(ts(end) - ts(start))
        self.jobs[jid].update(state="RUNNING", node=self.jobs[jid]["want"], start=start, end=end,
                              limit=f"{limit // 60}:{limit % 60:02d}")


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(cfg: SlurmConfig = CFG, t: str = "2026-11-24T17:00:01"):
    fake, clock = FakeSlurm(), Clock(ts(t))
    return fake, clock, SlurmBackend(cfg, clock, runner=fake)


def test_discover_holds_only_idle_unplanned_and_reports_claims() -> None:
    fake, clock, b = make()
    d = b.discover()
    assert d.idle == {"node1", "node2"}
    assert min(c.start for c in d.claims if "node3" in c.nodes and c.start is not None) == ts("2030-01-01T00:00:00")
    pid = b.submit(PilotRequest(("node1",)))
    assert b.submit(PilotRequest(("node1",))) == pid  # idempotent per node
    assert b.discover().idle == {"node2"}  # a queued pilot's node is not offered again


def test_lifecycle_preempted_versus_exited_versus_cancelled_versus_timeout() -> None:
    fake, clock, b = make()
    p1, p2 = b.submit(PilotRequest(("node1",))), b.submit(PilotRequest(("node2",)))
    assert [type(e) for e in b.poll()] == [PilotQueued, PilotQueued]
    fake.start(p1), fake.start(p2)
    started = b.poll()
    assert {e.pilot for e in started if isinstance(e, PilotStarted)} == {p1, p2}
    assert next(e for e in started if e.pilot == p1).expires_at == ts("2026-11-24T18:00:00")
    # p1: preempted, exits promptly -> COMPLETED + PreemptTime; p2: the agent left (released)
    fake.jobs[p1].update(state="COMPLETED", preempt="2026-11-24T17:10:00")
    fake.jobs[p2].update(state="COMPLETED")
    ended = {e.pilot: e.reason for e in b.poll() if isinstance(e, PilotEnded)}
    assert ended == {p1: EndReason.PREEMPTED, p2: EndReason.EXITED}
    p3, p4 = b.submit(PilotRequest(("node1",))), b.submit(PilotRequest(("node2",)))
    fake.start(p3), fake.start(p4)
    b.poll()
    b.cancel(p3)
    fake.jobs[p4].update(state="TIMEOUT")
    ended = {e.pilot: e.reason for e in b.poll() if isinstance(e, PilotEnded)}
    assert ended == {p3: EndReason.CANCELLED, p4: EndReason.TIMEOUT}
    assert b.pilots() == {}
    b.cancel(p3)  # idempotent on an ended pilot


def test_grace_time_is_ending_then_preempted() -> None:
    fake, clock, b = make()
    p = b.submit(PilotRequest(("node1",)))
    fake.start(p, "2026-11-24T17:00:00", "2026-11-24T18:00:00")
    b.poll()
    fake.jobs[p]["end"] = "2026-11-24T17:00:10"  # preempted: end cut to PreemptTime + GraceTime
    ending = [e for e in b.poll() if isinstance(e, PilotEnding)]
    assert ending == [PilotEnding(p, ("node1",), ts("2026-11-24T17:00:10"), EndReason.PREEMPTED)]
    fake.jobs[p].update(state="PREEMPTED")
    assert [e.reason for e in b.poll() if isinstance(e, PilotEnded)] == [EndReason.PREEMPTED]


def test_walltime_renewal_queues_a_replacement_that_takes_over() -> None:
    fake, clock, b = make()
    p = b.submit(PilotRequest(("node1",)))
    fake.start(p, "2026-11-24T17:00:00", "2026-11-24T17:02:00")
    b.poll()
    clock.t = ts("2026-11-24T17:01:10")  # within renew_before_s (60 s) of the walltime
    evs = b.poll()
    assert PilotEnding(p, ("node1",), ts("2026-11-24T17:02:00"), EndReason.TIMEOUT) in evs
    sbatch = [c for c in fake.calls if c[0] == "sbatch"][-1]
    assert f"--dependency=afterany:{p}" in sbatch and "--nodelist=node1" in sbatch
    new = [e for e in evs if isinstance(e, PilotQueued)]
    assert new and new[0].replaces == p and new[0].nodes == ("node1",)
    clock.t = ts("2026-11-24T17:02:05")  # queued longer than max_queued_s, but waits for its predecessor
    b.poll()
    assert new[0].pilot in b.pilots()
    fake.jobs[p].update(state="TIMEOUT")
    fake.start(new[0].pilot, "2026-11-24T17:02:05", "2026-11-24T17:04:05")
    evs = b.poll()
    assert PilotEnded(p, ("node1",), EndReason.TIMEOUT, "TIMEOUT") in evs
    assert any(isinstance(e, PilotStarted) and e.pilot == new[0].pilot for e in evs)


def test_a_pilot_past_its_walltime_is_ended_by_us_and_its_replacement_kept() -> None:
    """Slurm enforces limits in a 30-s pass: at the walltime the backend cancels the old pilot itself
    (reported as a timeout), so the replacement queued ``afterany`` takes the node at once."""
    fake, clock, b = make()
    p = b.submit(PilotRequest(("node1",)))
    fake.start(p, "2026-11-24T17:00:00", "2026-11-24T17:02:00")
    b.poll()
    clock.t = ts("2026-11-24T17:01:10")
    b.poll()
    new = next(v.id for v in b.pilots().values() if v.replaces == p)
    clock.t = ts("2026-11-24T17:02:00")  # the walltime; squeue still says RUNNING
    b.poll()
    assert [c for c in fake.calls if c[0] == "scancel"] == [("scancel", p)]  # not the replacement
    evs = b.poll()
    assert [(e.pilot, e.reason) for e in evs if isinstance(e, PilotEnded)] == [(p, EndReason.TIMEOUT)]
    assert new in b.pilots()


def test_preempted_pilot_takes_its_queued_replacement_with_it() -> None:
    fake, clock, b = make()
    p = b.submit(PilotRequest(("node1",)))
    fake.start(p, "2026-11-24T17:00:00", "2026-11-24T17:02:00")
    b.poll()
    clock.t = ts("2026-11-24T17:01:30")
    b.poll()
    old_view = b.pilots()[p]
    repl = next(v.id for v in b.pilots().values() if v.replaces == p)
    fake.jobs[p].update(state="COMPLETED", preempt="2026-11-24T17:01:31")
    b.poll()
    assert fake.jobs[repl]["state"] == "CANCELLED"
    assert [e.reason for e in b.poll() if isinstance(e, PilotEnded)] == [EndReason.CANCELLED]
    assert old_view.state is PilotState.ENDING  # walltime notice before the preemption


def test_stuck_queued_pilot_is_cancelled_and_vanished_job_is_unknown() -> None:
    fake, clock, b = make()
    p = b.submit(PilotRequest(("node1",)))
    clock.t += 31
    b.poll()
    assert fake.jobs[p]["state"] == "CANCELLED"
    assert [e.reason for e in b.poll() if isinstance(e, PilotEnded)] == [EndReason.CANCELLED]
    q = b.submit(PilotRequest(("node2",)))
    fake.jobs[q].update(forgotten=True, gone=True)  # gone from squeue and from scontrol
    assert [(e.pilot, e.reason) for e in b.poll() if isinstance(e, PilotEnded)] == [(q, EndReason.UNKNOWN)]


def test_failing_or_hanging_squeue_is_a_typed_error_and_changes_nothing() -> None:
    fake, clock, b = make()
    p = b.submit(PilotRequest(("node1",)))
    b.poll()
    fake.start(p)
    fake.fail["squeue"] = res(["squeue"], "", "squeue: error: Unable to contact slurm controller", 1)
    with pytest.raises(CommandFailed, match="squeue"):
        b.poll()
    assert b.pilots()[p].state is PilotState.QUEUED  # no guess from stale data
    fake.fail["squeue"] = CommandTimeout("squeue: timed out after 15 s", res(["squeue"], code=-1))
    with pytest.raises(CommandTimeout):
        b.poll()
    fake.fail["sinfo"] = CommandTimeout("sinfo: timed out", res(["sinfo"], code=-1))
    with pytest.raises(CommandTimeout):
        b.discover()
    fake.fail.clear()
    assert any(isinstance(e, PilotStarted) for e in b.poll())  # catches up


def test_submissions_are_rate_limited_capped_and_back_off() -> None:
    cfg = SlurmConfig(daemon_address="tcp://h:1", job_name="mt-pilot", submit_rate=1.0, submit_burst=2, max_pilots=3)
    fake, clock, b = make(cfg)
    fake.nodes = {f"n{i}": "idle" for i in range(10)}
    b.submit(PilotRequest(("n0",))), b.submit(PilotRequest(("n1",)))
    with pytest.raises(Throttled) as info:
        b.submit(PilotRequest(("n2",)))
    assert info.value.retry_at == pytest.approx(clock.t + 1.0)
    clock.t += 1.0
    b.submit(PilotRequest(("n2",)))
    clock.t += 10
    with pytest.raises(Throttled, match="3 pilots in flight"):
        b.submit(PilotRequest(("n3",)))
    assert sum(1 for c in fake.calls if c[0] == "sbatch") == 3
    lim = SubmitLimiter(rate=100, burst=100, backoff_s=1.0, backoff_max_s=4.0)
    lim.failed(0.0), lim.failed(0.0), lim.failed(0.0), lim.failed(0.0)
    assert lim.retry_at(0.0) == 4.0  # 1, 2, 4, capped at 4
    lim.succeeded()
    assert lim.retry_at(0.0) is None


def test_rejected_sbatch_raises_and_backs_off() -> None:
    fake, clock, b = make()
    fake.fail["sbatch"] = res(["sbatch"], "", "sbatch: error: QOSMaxSubmitJobPerUserLimit", 1)
    with pytest.raises(CommandFailed, match="QOSMaxSubmitJobPerUserLimit"):
        b.submit(PilotRequest(("node1",)))
    with pytest.raises(Throttled):
        b.submit(PilotRequest(("node1",)))
    assert b.pilots() == {}


# ---- a daemon restart, pilots without their agent --------------------------------------------


class Meta:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def get_meta(self, key: str) -> str | None:
        return self.data.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self.data[key] = value


class Hub(AgentRoster):
    def __init__(self, alive: set[str] | None = None, batch: dict[str, str] | None = None) -> None:
        self.up, self.batch = set(alive or ()), dict(batch or {})

    def alive(self) -> set[str]:
        return set(self.up)

    def batch_job(self, node: str) -> str | None:
        return self.batch.get(node)


def scavenging(b: SlurmBackend, meta: Meta, hub: Hub | None = None, **kw) -> Scavenging:
    return Scavenging(b, hub or Hub(), lambda kind, job=None, **d: None, meta=meta, **kw)


def test_a_restarted_daemon_takes_back_its_queued_running_and_ended_pilots() -> None:
    """The first daemon dies with a pilot queued (node1), one running (node2) and one that ends
    meanwhile (node4): the second one polls all three before it submits, and submits only node4's."""
    cfg = SlurmConfig(daemon_address="tcp://head:5555", job_name="mt-pilot", max_queued_s=600.0)
    fake, clock, b1 = make(cfg)
    fake.nodes["node4"] = "idle"
    meta = Meta()
    s1 = scavenging(b1, meta)
    s1.look(clock.t)
    q, r, e = s1.hold_idle(clock.t)
    fake.start(r), fake.start(e)
    s1.look(clock.t)
    assert set(json.loads(meta.data["pilots"])) == {q, r, e}
    # killed: no close, its pilots stay in Slurm; the pilot on node4 ends while no daemon runs
    fake.jobs[e].update(state="COMPLETED", preempt="2026-11-24T17:00:30")
    fake.nodes.update(node2="allocated", node4="idle")
    b2 = SlurmBackend(cfg, clock, runner=fake)
    s2 = scavenging(b2, meta)
    assert sorted(s2.resume()) == sorted([q, r, e])
    assert b2.discover().idle == set()  # their nodes are ours before any poll
    before = len([c for c in fake.calls if c[0] == "sbatch"])
    clock.t += 5
    events = s2.look(clock.t)
    assert [ev.pilot for ev in events if isinstance(ev, PilotStarted)] == [r]
    assert [(ev.pilot, ev.reason) for ev in events if isinstance(ev, PilotEnded)] == [(e, EndReason.PREEMPTED)]
    assert b2.pilots()[q].state is PilotState.QUEUED and b2.pilots()[r].state is PilotState.RUNNING
    s2.hold_idle(clock.t)
    assert [c for c in fake.calls if c[0] == "sbatch"][before:] == []  # a node just recalled: a main job may start
    clock.t += REQUEUE_AFTER_S
    s2.look(clock.t)
    s2.hold_idle(clock.t)  # still idle: held by the usual rule
    sbatch = [c for c in fake.calls if c[0] == "sbatch"][before:]
    assert [next(a for a in c if a.startswith("--nodelist=")) for c in sbatch] == ["--nodelist=node4"]
    assert set(json.loads(meta.data["pilots"])) == {q, r, *(b2.pilots().keys() - {q, r})}
    s2.close()
    assert json.loads(meta.data["pilots"]) == {}  # a clean stop cancelled them: nothing to take back


def test_resumed_pilots_count_towards_the_cap_and_keep_their_replacement() -> None:
    cfg = SlurmConfig(daemon_address="tcp://h:1", job_name="mt-pilot", max_pilots=2)
    fake, clock, b = make(cfg)
    fake.jobs.update({"7": {"state": "RUNNING", "want": "node1"}, "8": {"state": "PENDING", "want": "node1"}})
    fake.start("7", "2026-11-24T16:00:00", "2026-11-24T17:01:00")
    b.resume([SavedPilot(PilotId("7"), ("node1",)), SavedPilot(PilotId("8"), ("node1",), PilotId("7"))])
    with pytest.raises(Throttled, match="2 pilots in flight"):
        b.submit(PilotRequest(("node2",)))
    b.poll()
    assert b.pilots()[PilotId("8")].replaces == "7"
    fake.jobs["7"].update(state="PREEMPTED")
    b.poll()
    assert fake.jobs["8"]["state"] == "CANCELLED"  # a preempted pilot takes its replacement with it


def test_scancel_of_a_job_already_gone_is_fine_and_any_other_failure_is_not() -> None:
    d = SlurmDialect(CFG)
    d.check_cancel(res(["scancel", "7"], "", "scancel: error: Kill job error on job id 7: Job/step already "
                       "completing or completed\n", 1))
    d.check_cancel(res(["scancel", "8"], "", "scancel: error: Invalid job id specified\n", 1))
    with pytest.raises(CommandFailed, match="scancel"):
        d.check_cancel(res(["scancel", "7", "8"], "", "scancel: error: Invalid job id specified\n"
                           "scancel: error: Unable to contact slurm controller\n", 1))
    with pytest.raises(CommandFailed, match="scancel"):
        d.check_cancel(res(["scancel", "7"], "", "", 1))  # a failure that says nothing is not "gone"


def test_a_failed_scancel_leaves_the_pilot_not_cancelling() -> None:
    fake, clock, b = make()
    p = b.submit(PilotRequest(("node1",)))
    fake.fail["scancel"] = res(["scancel"], "", "scancel: error: Unable to contact slurm controller", 1)
    with pytest.raises(CommandFailed, match="scancel"):
        b.cancel(p)
    assert b.pilots()[p].cancelling is False
    fake.fail.clear()
    b.cancel(p)
    assert b.pilots()[p].cancelling is True


def test_a_running_pilot_whose_agent_never_says_hello_is_cancelled_after_the_grace() -> None:
    fake, clock, b = make()
    hub = Hub({"node2"}, {"node2": "4242"})  # node2's agent belongs to some other batch job
    s = scavenging(b, Meta(), hub, agent_grace=20.0)
    s.look(clock.t)
    p1, p2 = s.hold_idle(clock.t)
    fake.start(p1), fake.start(p2)
    s.look(clock.t)
    s.hold_idle(clock.t)
    clock.t += 19
    s.look(clock.t), s.hold_idle(clock.t)
    assert not [c for c in fake.calls if c[0] == "scancel"]
    clock.t += 1
    s.look(clock.t), s.hold_idle(clock.t)
    assert sorted(c[1] for c in fake.calls if c[0] == "scancel") == sorted([p1, p2])
    ended = {ev.pilot: ev.reason for ev in s.look(clock.t) if isinstance(ev, PilotEnded)}
    assert ended == {p1: EndReason.CANCELLED, p2: EndReason.CANCELLED}
