"""Issue K ("no way in, round two"), findings 2 to 10: each test replays the attack or the fault.

Tests that act as another local user need root (they drop to ``nobody`` with ``setpriv``, or
the agent drops to it); they are skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from malletrain.config import ConfigError, check_files, parse_config

ROOT = os.geteuid() == 0
NOBODY = 65534


# ---- 9: config ------------------------------------------------------------------------------


def test_admin_groups_is_accepted_as_documented_and_checked_at_config_check(tmp_path: Path) -> None:
    cfg = parse_config({"admin_groups": ["nogroup", 7]})
    assert cfg.admin_groups == ("nogroup", 7)
    check_files(cfg)
    f = tmp_path / "d.toml"
    f.write_text('runtime = "toy"\nadmin_groups = ["no-such-group-here"]\n')
    res = subprocess.run([sys.executable, "-m", "malletrain", "config", "check", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "admin_groups[0]" in res.stderr and "no-such-group-here" in res.stderr
    with pytest.raises(ConfigError, match="admin_groups must be a list"):
        parse_config({"admin_groups": "wheel"})


@pytest.mark.parametrize("method", [True, "fastest", 3])
def test_policy_method_is_checked_at_config_check(method: object) -> None:
    with pytest.raises(ConfigError, match="policy.method"):
        parse_config({"policy": {"method": method}})


# ---- 8, 9: the state dir --------------------------------------------------------------------


def test_a_pre_existing_open_state_dir_is_tightened_with_its_keys_checkpoints_and_logs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from malletrain.store import Store

    state = tmp_path / "state"
    (state / "checkpoints").mkdir(parents=True)
    (state / "logs").mkdir()
    for f in ("agent.key", "monitor.key", "checkpoints/j000001.ckpt", "logs/j000001.n0.w.log"):
        (state / f).write_bytes(b"x")
        os.chmod(state / f, 0o644)
    for d in (state, state / "checkpoints", state / "logs"):
        os.chmod(d, 0o755)
    Store.open(state / "store.db").close()
    assert state.stat().st_mode & 0o777 == 0o700
    for f in ("agent.key", "monitor.key", "checkpoints", "checkpoints/j000001.ckpt", "logs", "logs/j000001.n0.w.log"):
        assert (state / f).stat().st_mode & 0o077 == 0, f


def test_the_0711_a_root_daemon_sets_is_not_open_and_draws_no_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from malletrain.store import Store

    state = tmp_path / "state"
    state.mkdir()
    (state / "agent.key").write_bytes(b"k")
    os.chmod(state, 0o711)
    with caplog.at_level("WARNING"):
        Store.open(state / "store.db").close()
    assert state.stat().st_mode & 0o777 == 0o711  # the CLI leaves the daemon's mode alone
    assert "open to other users" not in caplog.text


def test_a_bad_ports_entry_in_the_store_names_the_file(tmp_path: Path) -> None:
    from malletrain.store import Store, StoreError

    store = Store.open(tmp_path / "store.db")
    try:
        assert store.ports(("monitor",)) == {"monitor": 0}
        for bad in ("[1, 2]", "{not json", '{"monitor": "x"}', '{"monitor": 70000}'):
            store.set_meta("ports", bad)
            with pytest.raises(StoreError, match=str(tmp_path / "store.db")):
                store.ports(("monitor", "agents"))
    finally:
        store.close()


@pytest.mark.skipif(not ROOT, reason="root ignores file modes: needs root to act as another user")
def test_a_daemon_on_a_read_only_state_dir_says_so_without_a_traceback(tmp_path: Path) -> None:
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="mt-ro-"))
    try:
        os.chmod(top, 0o755)
        state = top / "state"
        state.mkdir()
        os.chown(state, NOBODY, NOBODY)
        os.chmod(state, 0o555)
        cfg = top / "d.toml"
        cfg.write_text(f'state_dir = "{state}"\nruntime = "toy"\n[local]\nnodes = 1\ntrace = "none"\n')
        res = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                              sys.executable, "-m", "malletrain", "daemon", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=60, cwd="/")
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        assert f"state dir {state}: cannot write to it" in res.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ---- 7: repeated errors ---------------------------------------------------------------------


def test_a_repeating_error_is_written_once_per_window_with_the_count_held_back() -> None:
    import io
    import logging

    from malletrain.logs import RepeatFilter, setup_logging

    now = [0.0]
    buf = io.StringIO()
    handler = setup_logging("text", "info", stream=buf)
    handler.filters.clear()
    handler.addFilter(RepeatFilter(window_s=30.0, clock=lambda: now[0]))
    log = logging.getLogger("malletrain.test_k")
    try:
        for i in range(300):  # 30 s of a store write failing ten times a second
            now[0] = i / 10
            try:
                raise OSError(28, "No space left on device")
            except OSError:
                log.exception("reconcile step failed")
            log.info("tick %d", i)
        now[0] = 31.0
        log.error("reconcile step failed")  # the same template, after the window
    finally:
        logging.getLogger().removeHandler(handler)
    text = buf.getvalue()
    assert text.count("Traceback") == 1
    assert text.count("reconcile step failed") == 2 and "299 more like this" in text
    assert text.count("tick ") == 300  # INFO is never held back
