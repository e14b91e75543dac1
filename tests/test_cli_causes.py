"""Messages name the real cause: no daemon running; a root daemon's own 0711."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from malletrain.cli import daemon as cli_daemon
from malletrain.cli import main
from malletrain.daemon.statedir import private_state_dir
from malletrain.daemon.store import Store


def test_wait_without_a_daemon_says_no_daemon_is_running_there(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_daemon, "NO_DAEMON_GRACE_S", 0.5)
    state = tmp_path / "state"
    job = tmp_path / "job.toml"
    job.write_text('name = "a"\ncommand = ["true"]\nmin_nodes = 1\nmax_nodes = 1\nsamples = 10\n')
    assert main(["submit", str(job), "--state-dir", str(state)]) == 0
    jid = capsys.readouterr().out.strip()
    assert main(["wait", jid, "--timeout", "60", "--state-dir", str(state)]) == 1
    err = capsys.readouterr().err
    assert f"no daemon is running at {state}" in err
    assert "no idle node" not in err


def test_nodes_without_a_daemon_names_the_state_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nodes", "--state-dir", str(tmp_path)]) == 1
    assert f"no daemon is running at {tmp_path}" in capsys.readouterr().err


def test_status_without_a_daemon_names_the_state_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--state-dir", str(tmp_path)]) == 0
    assert f"no daemon is running at {tmp_path}" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["cancel", "j000007"], ["wait", "j000007", "--timeout", "1"]])
def test_an_unknown_job_names_the_state_dir_it_was_looked_for_in(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job id from another state dir (or a typo) is not found: the message says where it looked."""
    assert main([*command, "--state-dir", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "no job 'j000007'" in err and str(tmp_path) in err


def test_a_root_daemons_traversable_state_dir_is_left_alone_without_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    state.mkdir()
    Store.open(state / "store.db").close()
    os.chmod(state, 0o711)  # what a root daemon sets (control._traversable), so users reach its socket
    with caplog.at_level(logging.WARNING):
        private_state_dir(state)
        Store.open(state / "store.db").close()
    assert stat.S_IMODE(state.stat().st_mode) == 0o711
    assert not [r for r in caplog.records if "0700" in r.getMessage()]


def test_a_readable_state_dir_is_still_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o755)
    private_state_dir(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
