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
