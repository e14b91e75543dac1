"""The daemon's per-iteration work follows what changed (the loop at full-machine scale):
each incremental path is held to the full recompute it replaces."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import malletrain.daemon.store as store_mod
from malletrain.daemon.config import DaemonConfig, LocalConfig
from malletrain.daemon import Daemon
from malletrain.daemon.jobspec import JobSpec, JobState
from malletrain.daemon.store import Store

SPEC = JobSpec("j", ("true",))
LIVE = [s for s in JobState if not s.terminal]


# ---------------------------------------------------------------- the store: live jobs without their specs
def test_job_states_are_the_live_jobs_states_and_cancel_flags(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "s.db")
    try:
        ids = [s.submit(JobSpec(f"j{i}", ("true",))) for i in range(5)]
        s.set_state(ids[1], JobState.RUNNING, "placed")
        s.request_cancel(ids[1])  # running: flagged
        s.request_cancel(ids[2])  # pending: cancelled at once (not live)
        s.set_state(ids[3], JobState.FAILED, "x")
        got = s.job_states(LIVE)
        want = {r.id: (r.state, r.cancel_requested) for r in s.jobs(LIVE)}
        assert {k: (v.state, v.cancel_requested) for k, v in got.items()} == want
        assert list(got) == [ids[0], ids[1], ids[4]]  # submission order
        assert got[ids[1]].cancel_requested and not got[ids[0]].cancel_requested
    finally:
        s.close()


def test_the_daemon_reads_a_jobs_spec_once_not_at_every_iteration(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy", local=LocalConfig(nodes=2, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=4.0, loop_interval=0.05)
    d = Daemon(cfg)
    try:
        jid = d.store.submit(JobSpec("held", ("sleep", "60"), 1, 1))
        parsed: list[str] = []
        real = store_mod._stored_spec

        def counting(text: str, job: str) -> JobSpec:
            parsed.append(job)
            return real(text, job)

        monkeypatch.setattr(store_mod, "_stored_spec", counting)
        d.observe.submissions(d.clock())
        assert jid in d.runs
        first = parsed.count(jid)
        for _ in range(5):
            d.observe.submissions(d.clock())
        assert parsed.count(jid) == first  # read when it was new; the other iterations read its state only
        d.store.request_cancel(jid)  # a pending job: CANCELLED in the store at once
        d.observe.submissions(d.clock())
        assert d.runs[jid].ending == (JobState.CANCELLED, "cancelled by user")
    finally:
        d.close()


# ---------------------------------------------------------------- the hub's version, silence and pings
def _hub(tmp_path: Path, now: list[float], dead_after: float = 5.0):
    from scavenger.hub import AgentHub

    return AgentHub(dead_after_s=dead_after, clock=lambda: now[0], key_file=tmp_path / "agent.key")


def test_the_hubs_version_moves_whenever_its_agents_or_their_batch_jobs_change(tmp_path: Path) -> None:
    """A random run of hellos, heartbeats, leavings and silences: whenever ``version`` stayed the
    same, so did ``alive()`` and ``batch_jobs()``; and the agents declared silent are exactly
    those a look at every agent finds."""
    import random

    from scavenger import protocol as P

    rng = random.Random(7)
    now = [1000.0]
    hub = _hub(tmp_path, now)
    try:
        nodes = [f"n{i}" for i in range(12)]
        def now_seen() -> tuple[int, set[str], dict[str, str | None]]:  # (batch jobs: computed, not the hub's)
            return hub.version, hub.alive(), {n: info.batch_job for n, info in hub.agents.items()}

        before = now_seen()
        for _ in range(600):
            node = rng.choice(nodes)
            op = rng.random()
            if op < 0.3:
                hub._handle(P.Hello(node, 1, (), rng.choice(["1", "2", None])), now[0])
            elif op < 0.7:
                hub._handle(P.Heartbeat(node), now[0])
            elif op < 0.8:
                hub._handle(P.Leaving(node, "recalled"), now[0])
            else:
                now[0] += rng.uniform(0.0, 3.0)
                silent = {n for n, info in hub.agents.items() if now[0] - info.last_seen > hub.dead_after_s}
                assert {ev.node for ev in hub._silent(now[0])} == silent
                assert not any(now[0] - info.last_seen > hub.dead_after_s for info in hub.agents.values())
            after = now_seen()
            assert dict(hub.batch_jobs()) == after[2]
            if after[0] == before[0]:
                assert after[1:] == before[1:]
            before = after
    finally:
        hub.close()


def test_pings_are_spread_each_agent_pinged_once_per_interval(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from scavenger import protocol as P

    now = [1000.0]
    hub = _hub(tmp_path, now, dead_after=30.0)  # a ping every 3 s
    sent: list[tuple[float, str]] = []
    monkeypatch.setattr(hub, "send", lambda msg: sent.append((now[0], msg.node)) or True)
    try:
        for i in range(30):  # agents come up over 3 s
            hub._handle(P.Hello(f"n{i}", 1), now[0])
            hub._ping(now[0])
            now[0] += 0.1
        for _ in range(60):  # 6 s more, heartbeats keep them alive
            hub._ping(now[0])
            now[0] += 0.1
        per_poll = {}
        for t, _ in sent:
            per_poll[t] = per_poll.get(t, 0) + 1
        assert max(per_poll.values()) <= 2  # never every agent in one poll
        for i in range(30):
            times = [t for t, n in sent if n == f"n{i}"]
            assert len(times) >= 2 and all(2.9 <= b - a <= 3.1 for a, b in zip(times, times[1:]))
        hub._handle(P.Leaving("n0", "recalled"), now[0])
        sent.clear()
        for _ in range(40):
            hub._ping(now[0])
            now[0] += 0.1
        assert "n0" not in {n for _, n in sent} and len({n for _, n in sent}) == 29
    finally:
        hub.close()


# ---------------------------------------------------------------- Scavenging: answers by versions
def test_usable_nodes_and_agentless_pilots_equal_a_full_recompute_after_random_events(tmp_path: Path) -> None:
    """Pilots submitted, started, recalled, given back, cancelled; agents saying hello (with the
    right or a wrong batch job), leaving, falling silent: after each event the answers kept by
    version are what a look at every pilot and agent gives."""
    import random

    from malletrain.daemon.scavenging import Scavenging
    from scavenger import protocol as P
    from scavenger.slurm import SlurmBackend, SlurmConfig
    from tests.clusters.fake_slurm import FakeSlurm

    rng = random.Random(11)
    now = [1000.0]
    nodes = [f"n{i}" for i in range(10)]
    slurm = FakeSlurm(nodes)
    be = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", max_pilots=100, submit_rate=1000.0,
                                  submit_burst=1000, renew_before_s=0.0), runner=slurm.run)
    hub = _hub(tmp_path, now)
    scav = Scavenging(be, hub, lambda *a, **k: None, agent_grace=3.0)
    usable_steps = 0
    try:
        for step in range(400):
            op = rng.random()
            node = rng.choice(nodes)
            if op < 0.2:
                scav.look(now[0])
                scav.hold_idle(now[0])
            elif op < 0.3:
                slurm.recall(node)
            elif op < 0.4:
                slurm.give_back(node)
            elif op < 0.6:
                pilot = slurm.running().get(node)
                batch = pilot if rng.random() < 0.8 else "999"
                hub._handle(P.Hello(node, 1, (), batch), now[0])
            elif op < 0.75:
                hub._handle(P.Heartbeat(node), now[0])
            elif op < 0.8:
                hub._handle(P.Leaving(node, "recalled"), now[0])
            elif op < 0.85:
                scav.release({node})
            else:
                now[0] += rng.uniform(0.0, 2.0)
                hub._silent(now[0])
            assert scav.usable() == scav._usable_now(), step
            usable_steps += bool(scav.usable())
            scav._cancel_agentless(now[0])
            assert scav._agentless is not None
            assert scav._agentless[0] != scav.versions() or scav._agentless[1] == scav._agentless_pilots(), step
            assert scav._taken is None or scav._taken[0] != scav.versions() or \
                scav._taken[1] == {n for v in be.pilots().values() for n in v.nodes}, step
        # the run went through many changes (pilots queued for recalled nodes may leave none usable at the end)
        assert usable_steps > 40 and be.version > 30 and hub.version > 50, (usable_steps, be.version)
    finally:
        hub.close()


# ---------------------------------------------------------------- between two loop iterations
class _AgentOnHub:
    """A real hub and one agent socket ``n1`` beside it, for the loop's wait: the agent shakes hands
    (each frame the hub answers is read through ``pump``, the wait under test) and then sends sealed
    messages."""

    def __init__(self, tmp_path: Path) -> None:
        import zmq

        from scavenger import channel as C
        from scavenger.hub import AgentHub

        self.hub = AgentHub(dead_after_s=30.0, key_file=tmp_path / "agent.key")
        self.key = C.read_key_file(self.hub.key_file)
        self.ctx = zmq.Context()
        self.agent = self.ctx.socket(zmq.DEALER)
        self.agent.setsockopt(zmq.IDENTITY, b"n1")
        self.agent.setsockopt(zmq.LINGER, 0)
        self.agent.connect(self.hub.address)
        self.session: object = None

    def handshake(self, pump: Callable[[], None]) -> None:
        """Challenge and proof, ``pump()`` after each frame the hub must answer."""
        from scavenger import channel as C

        nonce_a = C.new_nonce()
        self.agent.send(C.challenge_frame(nonce_a))
        pump()
        assert self.agent.poll(5000)
        nonce_h = C.parse_nonce(self.agent.recv())
        self.agent.send(C.finish_frame(C.agent_proof(self.key, "n1", nonce_a, nonce_h)))
        pump()
        assert self.agent.poll(5000) and C.kind_of(self.agent.recv()) is C.Kind.PROOF
        self.session = C.Session.for_agent(C.session_key(self.key, "n1", nonce_a, nonce_h))

    def send(self, msg: object, seq: int) -> None:
        from scavenger import protocol as P

        self.agent.send(self.session.seal(P.encode(msg, seq)))  # type: ignore[attr-defined]

    def close(self) -> None:
        self.agent.close(0)
        self.hub.close()
        self.ctx.term()


def test_a_recall_ends_the_wait_between_iterations_and_heartbeats_do_not(tmp_path: Path) -> None:
    """The loop's wait reads reports and agent frames as they come (through the observe phase it is
    given), and an agent's ``leaving`` ends it at once: the recall is decided on at the next
    iteration, not a tick later."""
    import contextlib

    import zmq

    from malletrain.daemon.loopwait import LoopWait
    from scavenger import protocol as P

    a = _AgentOnHub(tmp_path)
    hub, ctx = a.hub, a.ctx

    class Reports:  # the monitor's part: a socket and drain()
        def __init__(self) -> None:
            self.sock = ctx.socket(zmq.PULL)
            self.sock.bind("inproc://reports")
            self.read = 0

        def drain(self, timeout_ms: int = 0) -> int:
            n = 0
            while self.sock.poll(timeout_ms if n == 0 else 0):
                self.sock.recv()
                n += 1
            self.read += n
            return n

    reports = Reports()
    push = ctx.socket(zmq.PUSH)
    push.connect("inproc://reports")
    seen: list[object] = []
    wait = LoopWait(reports, hub, lambda now: seen.extend(hub.poll()), contextlib.nullcontext, lambda: 0.0)

    def pump() -> None:
        assert wait.wait(0.5) is False

    try:
        a.handshake(pump)
        a.send(P.Hello("n1", 1), 1)
        a.send(P.Heartbeat("n1"), 2)
        push.send(b"a report")
        assert wait.wait(0.5) is False  # an agent up and a heartbeat: the next tick is soon enough
        assert "n1" in hub.alive() and reports.read == 1  # ... but both were read as they came
        a.send(P.Leaving("n1", "recalled"), 3)
        assert wait.wait(30.0) is True  # a recall: the next iteration starts now
        assert "n1" not in hub.alive() and any(getattr(ev, "node", "") == "n1" and type(ev).__name__ == "AgentGone"
                                               for ev in seen)
    finally:
        push.close(0)
        reports.sock.close(0)
        a.close()


def test_a_wait_with_no_time_left_still_reads_a_recall_already_there(tmp_path: Path) -> None:
    """After an iteration that overran its interval the loop does not wait, but it reads the agent
    frames already queued: a ``leaving`` among them makes the next iteration a quick one."""
    import contextlib

    import zmq

    from malletrain.daemon.loopwait import LoopWait
    from scavenger import protocol as P

    a = _AgentOnHub(tmp_path)
    hub, ctx = a.hub, a.ctx

    class Reports:
        def __init__(self) -> None:
            self.sock = ctx.socket(zmq.PULL)
            self.sock.bind("inproc://reports-0")

        def drain(self, timeout_ms: int = 0) -> int:
            return 0

    reports = Reports()
    wait = LoopWait(reports, hub, lambda now: hub.poll(), contextlib.nullcontext, lambda: 0.0)

    def pump() -> None:
        assert wait.wait(0.5) is False

    try:
        a.handshake(pump)
        a.send(P.Hello("n1", 1), 1)
        assert hub.sock.poll(5000)
        assert wait.wait(0.0) is False and "n1" in hub.alive()  # read at once, with no time to wait
        a.send(P.Leaving("n1", "recalled"), 2)
        assert hub.sock.poll(5000)
        assert wait.wait(0.0) is True and "n1" not in hub.alive()
        assert wait.wait(-1.0) is False  # nothing there: returns at once
    finally:
        reports.sock.close(0)
        a.close()

def test_a_polls_observations_equal_a_fresh_parse_after_random_changes() -> None:
    import random

    from scavenger.base import BadReply, PilotRequest
    from scavenger.slurm import SlurmConfig, SlurmDialect
    from tests.clusters.fake_slurm import FakeSlurm

    rng = random.Random(5)
    clock = [1_790_000_000.0]
    nodes = [f"n{i:02d}" for i in range(40)]
    slurm = FakeSlurm(nodes, clock=lambda: clock[0])
    cfg = SlurmConfig(daemon_address="tcp://127.0.0.1:1", partition="preemptable")
    polled = SlurmDialect(cfg)
    pilots = []
    parsed = 0
    for step in range(120):
        node = rng.choice(nodes)
        op = rng.random()
        if op < 0.4:
            pilots.append(polled.parse_submit(slurm.run(polled.render_submit(PilotRequest((node,)), 3600.0))))
        elif op < 0.6:
            slurm.recall(node)
        elif op < 0.7:
            slurm.give_back(node)
        else:
            clock[0] += rng.uniform(0.0, 5000.0)  # the hour changes too
            slurm.tick()
        reply = slurm.run(polled.render_poll(pilots))
        wanted = rng.sample(pilots, k=len(pilots) // 2) if pilots else []
        assert polled.parse_poll(reply, wanted) == SlurmDialect(cfg).parse_poll(reply, wanted), step
        parsed += len(polled._last_poll)
    assert parsed > 600
    with pytest.raises(BadReply, match="squeue line 2"):  # a line the last reply had is no excuse for a bad one
        polled.parse_poll(reply.__class__(reply.argv, 0, reply.stdout.splitlines()[0] + "\n1|2|3\n", "", 0.0),
                          pilots)


def test_sinfo_parsed_after_earlier_replies_equals_a_fresh_parse() -> None:
    import random

    from scavenger.base import BadReply, CommandResult
    from scavenger.slurm import SlurmConfig, SlurmDialect

    rng = random.Random(3)
    cfg = SlurmConfig(daemon_address="tcp://127.0.0.1:1", partition="preemptable")
    polled = SlurmDialect(cfg)
    states = ["idle", "allocated", "planned", "idle*", "mixed", "drained", "idle-"]
    for step in range(150):
        lines = [f"n{rng.randrange(30):02d}|{rng.choice(states)}" for _ in range(rng.randrange(1, 40))]
        if rng.random() < 0.1:
            lines.insert(rng.randrange(len(lines)), "")
        reply = CommandResult(("sinfo",), 0, "\n".join(lines) + "\n", "", 0.0)
        assert polled.parse_nodes(reply) == SlurmDialect(cfg).parse_nodes(reply), step  # first line of a name wins
    with pytest.raises(BadReply, match="sinfo line 2"):
        polled.parse_nodes(CommandResult(("sinfo",), 0, lines[0] + "\nbad line\n", "", 0.0))


def test_a_pilot_whose_agent_came_back_since_the_last_look_is_not_cancelled(tmp_path: Path) -> None:
    """The agentless pilots are looked for at most every second (a pass over every pilot); a pilot in
    that list whose agent has said hello since is asked again before it is cancelled."""
    from malletrain.daemon.scavenging import Scavenging
    from scavenger import protocol as P
    from scavenger.base import PilotRequest
    from scavenger.slurm import SlurmBackend, SlurmConfig
    from tests.clusters.fake_slurm import FakeSlurm

    now = [1000.0]
    slurm = FakeSlurm(["n0", "n1"])
    be = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", renew_before_s=0.0), runner=slurm.run)
    hub = _hub(tmp_path, now, dead_after=1e6)
    cancelled: list[str] = []
    scav = Scavenging(be, hub, lambda kind, job=None, **d: cancelled.append(d["pilot"]) if kind == "pilot_cancelled"
                      else None, agent_grace=10.0)
    try:
        p0, p1 = be.submit(PilotRequest(("n0",))), be.submit(PilotRequest(("n1",)))
        be.poll()
        scav._cancel_agentless(now[0])  # neither agent yet: both watched
        now[0] = 1009.95
        scav._cancel_agentless(now[0])  # looked again (due): both still agentless
        hub._handle(P.Hello("n0", 1, (), p0), now[0])  # n0's agent arrives; the list is not looked at again yet
        now[0] = 1010.05
        scav._cancel_agentless(now[0])
        assert cancelled == [p1]  # n1 is past its grace; n0's agent came back in time
        assert scav._agentless is not None and scav._agentless[0] != scav.versions()  # (the list was not redone)
    finally:
        hub.close()


def test_the_pilots_of_many_nodes_whose_agents_left_are_cancelled_with_one_command(tmp_path: Path) -> None:
    from malletrain.daemon.scavenging import Scavenging
    from scavenger.base import PilotRequest
    from scavenger.slurm import SlurmBackend, SlurmConfig
    from tests.clusters.fake_slurm import FakeSlurm

    now = [1000.0]
    nodes = [f"n{i}" for i in range(5)]
    slurm = FakeSlurm(nodes)
    be = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", renew_before_s=0.0, submit_burst=10),
                      runner=slurm.run)
    hub = _hub(tmp_path, now)
    logged: list[str] = []
    scav = Scavenging(be, hub, lambda kind, job=None, **d: logged.append(d.get("pilot", "")) if kind == "pilot_cancelled"
                      else None)
    try:
        pilots = [be.submit(PilotRequest((n,))) for n in nodes]
        be.poll()
        before = slurm.commands.get("scancel", 0)
        scav.release({"n0", "n1", "n2", "n4"})  # no agent on any: their agents left
        assert slurm.commands.get("scancel", 0) == before + 1  # one scancel, not four
        assert logged == sorted([pilots[0], pilots[1], pilots[2], pilots[4]])
        assert {pid for pid, v in be.pilots().items() if v.cancelling} == set(logged)
    finally:
        hub.close()


def test_the_pilots_on_a_node_are_those_a_look_at_every_pilot_finds() -> None:
    import random

    from scavenger.base import PilotRequest
    from scavenger.slurm import SlurmBackend, SlurmConfig
    from tests.clusters.fake_slurm import FakeSlurm

    rng = random.Random(9)
    nodes = [f"n{i}" for i in range(8)]
    slurm = FakeSlurm(nodes)
    be = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", renew_before_s=0.0, submit_rate=1000.0,
                                  submit_burst=1000, max_pilots=100), runner=slurm.run)
    for step in range(150):
        node = rng.choice(nodes)
        op = rng.random()
        if op < 0.35:
            be.submit(PilotRequest((node,)))
        elif op < 0.5:
            slurm.recall(node)
        elif op < 0.6:
            slurm.give_back(node)
        elif op < 0.7 and be.pilots():
            be.cancel(rng.choice(sorted(be.pilots())))
        else:
            be.poll()
        for n in nodes:
            assert be.pilots_on(n) == [v for pid, v in sorted(be.pilots().items()) if n in v.nodes], step
