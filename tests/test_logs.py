"""The daemon's log: JSON lines (``[log] format = "json"``) name their job / node; text is the default."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from procs import procs_mentioning
from malletrain.daemon.config import DaemonConfig, LocalConfig
from malletrain.daemon import Daemon
from malletrain.daemon.jobspec import JobSpec, JobState
from malletrain.daemon.logs import JsonFormatter, about, setup_logging
from tests.stepping import step_until

TOY = (sys.executable, "-m", "malletrain.worker.toy")


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = setup_logging("json", "info", stream=buf)
    yield buf
    root.removeHandler(handler)
    root.setLevel(level)


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]  # every line is one JSON object


def test_every_json_line_has_the_fields_and_names_its_job_node_or_pilot(json_log: io.StringIO) -> None:
    log = logging.getLogger("malletrain.test")
    log.info("plain")
    log.warning("job %s lost node %s", "j000001", "n1", extra=about(job="j000001", node="n1"))
    log.info("pilot %s", "123", extra=about(pilot="123", job=""))
    log.info('odd "text"\nwith a newline and \x1b[31m')
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra=about(worker="j000001.n1.5"))
    got = lines(json_log)
    assert len(got) == 5
    for line in got:
        assert {"time", "level", "logger", "message"} <= set(line)
        assert line["logger"] == "malletrain.test" and str(line["time"]).endswith("Z")
    assert "job" not in got[0] and "node" not in got[0]
    assert got[1]["job"] == "j000001" and got[1]["node"] == "n1" and got[1]["level"] == "WARNING"
    assert got[2]["pilot"] == "123" and "job" not in got[2]
    assert got[3]["message"] == 'odd "text"\nwith a newline and \x1b[31m'
    assert got[4]["worker"] == "j000001.n1.5" and "ValueError: boom" in str(got[4]["exc"])


def test_text_lines_carry_the_same_fields() -> None:
    buf = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = setup_logging("text", "info", stream=buf)
    try:
        logging.getLogger("malletrain.test").info("hello", extra=about(job="j1", node="n2"))
        assert buf.getvalue().rstrip().endswith("malletrain.test INFO hello [job=j1 node=n2]")
        setup_logging("text", "warning", stream=buf)  # replaces the first handler: no duplicate lines
        assert handler not in root.handlers
    finally:
        for h in [h for h in root.handlers if getattr(h, "_malletrain", False)]:
            root.removeHandler(h)
        root.setLevel(level)
    with pytest.raises(ValueError, match="log level"):
        setup_logging("text", "loud")


def test_json_time_is_utc_iso8601_with_milliseconds() -> None:
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    rec.created = 1_700_000_000.25
    assert json.loads(JsonFormatter().format(rec))["time"] == "2023-11-14T22:13:20.250Z"


def until(d: Daemon, pred: Callable[[], bool], timeout: float = 90.0) -> None:
    step_until(d, pred, timeout)


@pytest.mark.slow
def test_a_daemons_json_log_names_jobs_and_nodes(tmp_path: Path, json_log: io.StringIO) -> None:
    cfg = DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy", local=LocalConfig(nodes=1, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=4.0, loop_interval=0.05)
    d = Daemon(cfg)
    try:
        jid = d.store.submit(JobSpec("toy", TOY + ("--rate", "2000"), 1, 1, False, {1: 100.0}))
        until(d, lambda: d.runs[jid].last_progress > 0)
        d.store.request_cancel(jid)
        until(d, lambda: d.store.require(jid).state is JobState.CANCELLED)
    finally:
        d.close()
    got = lines(json_log)
    assert all({"time", "level", "logger", "message"} <= set(line) for line in got)
    about_job = [line for line in got if line.get("job") == jid]
    assert any("-> running" in str(line["message"]) for line in about_job)
    assert any("-> cancelled" in str(line["message"]) for line in about_job)
    assert any(line.get("node") and "agent up on node" in str(line["message"]) for line in got)
    assert procs_mentioning(str(tmp_path / "state")) == []


@pytest.mark.slow
def test_the_daemon_command_logs_json_lines_on_stderr(tmp_path: Path) -> None:
    f = tmp_path / "d.toml"
    f.write_text(f'state_dir = "{tmp_path / "state"}"\nruntime = "toy"\nagent_heartbeat = 0.2\nagent_dead_after = 2.0\n'
                 '[local]\nnodes = 1\ntrace = "none"\n[log]\nformat = "json"\n')
    res = subprocess.run([sys.executable, "-m", "malletrain", "daemon", "--config", str(f), "--duration", "4"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = [json.loads(line) for line in res.stderr.splitlines()]
    assert got and all({"time", "level", "logger", "message"} <= set(line) for line in got)
    assert any(line.get("node") for line in got)  # "agent up on node ..."
    assert procs_mentioning(str(tmp_path / "state")) == []
