"""Prometheus metrics: off by default (nothing served), on with ``[metrics] address``; the
expected names over HTTP from a real daemon; the scheduler-command hook; no global state."""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import psutil
import pytest
import zmq

from procs import procs_mentioning
from malletrain.daemon.config import DaemonConfig, LocalConfig, MetricsConfig
from malletrain.daemon import Daemon
from malletrain.daemon.jobspec import JobSpec, JobState
from contract.messages import Report
from malletrain.daemon.metrics import Metrics, MetricsAddressError, parse_address
from scavenger.base import CommandFailed, CommandResult, CommandTimeout, observed, run_command
from tests.stepping import step_until

TOY = (sys.executable, "-m", "malletrain.worker.toy")


def config(tmp: Path, address: str = "") -> DaemonConfig:
    return DaemonConfig(state_dir=str(tmp / "state"), runtime="toy", local=LocalConfig(nodes=2, trace="none"),
                        agent_heartbeat=0.2, agent_dead_after=4.0, loop_interval=0.05,
                        metrics=MetricsConfig(address))


def until(d: Daemon, pred: Callable[[], bool], timeout: float = 90.0) -> None:
    step_until(d, pred, timeout, detail=lambda: f"monitor: {d.monitor.counts()}")


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return resp.read().decode()


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, from the text exposition format."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.Process(os.getpid()).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


@pytest.mark.slow
def test_a_daemon_with_metrics_on_serves_the_expected_names(tmp_path: Path) -> None:
    d = Daemon(config(tmp_path, "127.0.0.1:0"))
    try:
        assert d.metrics.enabled and d.metrics.address.startswith("127.0.0.1:")
        # one node at most: no rescale can change its size (or its measured rate) between the checks
        jid = d.store.submit(JobSpec("toy", TOY + ("--rate", "2000"), 1, 1, False, {1: 100.0}))
        until(d, lambda: len(d.hub.alive()) == 2 and d.runs[jid].state.value == "running"
              and d.runs[jid].last_progress > 0)
        push = d.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(d.monitor.address)
        push.send(Report(jid, 1, 64, time.time(), 1).encode())  # unsigned: rejected, counted by reason
        try:  # open until it arrived: closing with LINGER 0 drops a frame the connect has not carried yet
            until(d, lambda: d.monitor.counts()["unsigned"] == 1
                  and (d.monitor.jobs[jid].throughput.estimate(d.monitor.jobs[jid].world_size) is not None))
        finally:
            push.close(0)
        d._next_sample = 0.0  # the 1-s sampler runs at the next step
        d.step()
        got = samples(scrape(d.metrics.address))
        members, state = len(d.runs[jid].members), d.runs[jid].state.value
    finally:
        d.close()
    assert got['malletrain_nodes{state="held"}'] == 2 and got['malletrain_nodes{state="used"}'] == members
    assert got['malletrain_nodes{state="idle"}'] == 0
    assert got[f'malletrain_jobs{{state="{state}"}}'] == 1 and got['malletrain_jobs{state="pending"}'] == 0
    assert got[f'malletrain_job_throughput_samples_per_second{{job="{jid}"}}'] > 0
    assert got[f'malletrain_job_nodes{{job="{jid}"}}'] == members == 1 and state == "running"
    assert 'malletrain_jobs_ended_total{state="cancelled"}' not in got
    assert got["malletrain_decision_seconds_count"] >= 1
    assert got["malletrain_reports_accepted_total"] >= 1
    assert got["malletrain_reports_received_total"] >= got["malletrain_reports_accepted_total"] + 1
    assert got['malletrain_reports_rejected_total{reason="unsigned"}'] == 1
    assert "process_resident_memory_bytes" in got
    assert procs_mentioning(str(tmp_path / "state")) == []


def test_metrics_are_off_by_default_and_nothing_is_served(tmp_path: Path) -> None:
    before = listening_ports()
    d = Daemon(config(tmp_path))
    try:
        assert not d.metrics.enabled and d.metrics.address == ""
        d.step()
        opened = listening_ports() - before
        ours = {int(a.rsplit(":", 1)[1]) for a in (d.monitor.address, d.hub.address)}
        ours.add(int(getattr(d.runtime, "port", 0) or 0))
        assert opened <= ours  # the monitor, the agent hub and the runtime: no HTTP server
    finally:
        d.close()


def test_two_metrics_objects_have_separate_registries() -> None:
    a, b = Metrics("127.0.0.1:0"), Metrics("127.0.0.1:0")
    try:
        a.observe_decision(0.01)
        a.observe_rescale("up", 2.5)
        a.observe_state(JobState.CANCELLED)
        a.observe_state(JobState.RUNNING)
        b.observe_nodes(3, 2, 1)
        ga, gb = samples(scrape(a.address)), samples(scrape(b.address))
        assert ga["malletrain_decision_seconds_count"] == 1 and gb["malletrain_decision_seconds_count"] == 0
        assert ga['malletrain_rescale_pause_seconds_total{kind="up"}'] == 2.5
        assert ga['malletrain_jobs_ended_total{state="cancelled"}'] == 1 and len([k for k in ga if "ended_total" in k]) == 1
        assert gb['malletrain_nodes{state="idle"}'] == 3 and ga['malletrain_nodes{state="idle"}'] == 0
    finally:
        a.close()
        b.close()
    with pytest.raises(urllib.error.URLError):
        scrape(a.address)


def test_a_busy_metrics_port_is_an_error_naming_the_address() -> None:
    a = Metrics("127.0.0.1:0")
    try:
        with pytest.raises(MetricsAddressError, match=f"metrics.address {a.address}: cannot serve"):
            Metrics(a.address)
    finally:
        a.close()


def test_the_disabled_metrics_do_nothing() -> None:
    m = Metrics()
    m.observe_decision(1.0)
    m.observe_nodes(1, 2, 3)
    m.observe_runs([object()], object())  # not even looked at
    m.observe_monitor(object())
    m.observe_command(("sbatch",), 1.0, "ok")
    m.observe_state(object())
    m.close()
    assert not m.enabled and m.address == ""


def test_scheduler_commands_are_counted_by_result_with_their_latency(tmp_path: Path) -> None:
    m = Metrics("127.0.0.1:0")
    try:
        runner = observed(run_command, m.observe_command)
        res = runner([sys.executable, "-c", "pass"], timeout=30)
        assert res.returncode == 0
        with pytest.raises(CommandFailed):
            runner([sys.executable, "-c", "import sys; sys.exit(2)"], timeout=30)
        with pytest.raises(CommandFailed):
            runner([str(tmp_path / "no-such-squeue")], timeout=30)
        with pytest.raises(CommandTimeout):
            runner([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
        unchecked = runner([sys.executable, "-c", "import sys; sys.exit(1)"], timeout=30, check=False)
        assert unchecked.returncode == 1
        got = samples(scrape(m.address))
    finally:
        m.close()
    py = os.path.basename(sys.executable)
    assert got[f'malletrain_scheduler_commands_total{{command="{py}",result="ok"}}'] == 1
    assert got[f'malletrain_scheduler_commands_total{{command="{py}",result="failed"}}'] == 2
    assert got[f'malletrain_scheduler_commands_total{{command="{py}",result="timeout"}}'] == 1
    assert got['malletrain_scheduler_commands_total{command="no-such-squeue",result="failed"}'] == 1
    assert got[f'malletrain_scheduler_command_seconds_count{{command="{py}"}}'] == 4


def test_observed_passes_results_and_errors_through_unchanged() -> None:
    seen: list[tuple[tuple[str, ...], float, str]] = []
    ok = CommandResult(("squeue",), 0, "out", "", 0.25)

    def fake(argv: object, **kw: object) -> CommandResult:
        if kw.get("fail"):
            raise CommandTimeout("squeue: timed out", CommandResult(("squeue",), -1, "", "", 15.0))
        return ok

    runner = observed(fake, lambda *a: seen.append(a))
    assert runner(["squeue"]) is ok
    with pytest.raises(CommandTimeout):
        runner(["squeue"], fail=True)
    assert seen == [(("squeue",), 0.25, "ok"), (("squeue",), 15.0, "timeout")]


@pytest.mark.parametrize("text", ["", "host:1", "1.2.3.4:x", "1.2.3.4:70000", "::1:80", "[::1]80", "1.2.3.4:-1"])
def test_bad_addresses_are_refused(text: str) -> None:
    with pytest.raises(MetricsAddressError, match="metrics.address"):
        parse_address(text)
