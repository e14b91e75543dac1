"""The daemon's per-iteration work follows what changed (issue 23, the loop at full-machine scale):
each incremental path is held to the full recompute it replaces."""

from __future__ import annotations

from pathlib import Path

import pytest

import malletrain.store as store_mod
from malletrain.config import DaemonConfig, LocalConfig
from malletrain.daemon import Daemon
from malletrain.jobspec import JobSpec, JobState
from malletrain.store import Store

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
        d._observe_store(d.clock())
        assert jid in d.runs
        first = parsed.count(jid)
        for _ in range(5):
            d._observe_store(d.clock())
        assert parsed.count(jid) == first  # read when it was new; the other iterations read its state only
        d.store.request_cancel(jid)  # a pending job: CANCELLED in the store at once
        d._observe_store(d.clock())
        assert d.runs[jid].ending == (JobState.CANCELLED, "cancelled by user")
    finally:
        d.close()
