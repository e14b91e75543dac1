"""Daemon config: ranges, finite floats, rules between keys, `config check`, and fuzzing."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malletrain.daemon.config import LIMITS, ConfigError, DaemonConfig, load_config, parse_config, to_toml

FLOAT_KEYS = [(prefix, key) for prefix, table in LIMITS.items() for key, lim in table.items() if lim.kind is float]


def _toml(prefix: str, key: str, value: str) -> str:
    return f"{key} = {value}\n" if not prefix else f"[{prefix.rstrip('.')}]\n{key} = {value}\n"


@pytest.mark.parametrize("prefix, key", FLOAT_KEYS, ids=[p + k for p, k in FLOAT_KEYS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "9223372036854775807", "1" + "0" * 400])
def test_every_float_key_refuses_non_finite_and_absurd_values(tmp_path: Path, prefix: str, key: str, value: str) -> None:
    f = tmp_path / "d.toml"
    f.write_text(_toml(prefix, key, value))
    with pytest.raises(ConfigError, match=f"{prefix}{key} must be") as info:
        load_config(f)
    assert str(f) in str(info.value)


@pytest.mark.parametrize("text, why", [
    ("loop_interval = inf", "loop_interval must be a finite number"),
    ("loop_interval = 9223372036854775807", "loop_interval must be <= 60"),
    ("agent_heartbeat = 1.0\nagent_dead_after = 0.5", r"agent_dead_after \(0.5\) must be at least twice agent_heartbeat \(1\)"),
    ("agent_heartbeat = 1.0\nagent_dead_after = 1.5", "agent_dead_after"),
    ("max_running = 3", r"max_running moved to \[policy\] max_running"),
    ("tfwd = 60.0", r"tfwd moved to \[policy\] tfwd_s"),
    ("[policy]\ntfwd_s = nan", "policy.tfwd_s must be a finite number"),
    ("[policy]\nmax_running = 9223372036854775807", "policy.max_running must be"),
    ("[policy]\nprofile_time_cap_s = " + "9" * 400, "policy.profile_time_cap_s must be a finite number"),
    ("[policy]\ncolour = 1", "unknown key"),
    ("[local]\nnodes = 100000", "local.nodes must be <= 1024"),
    ("[local]\nmachine_nodes = 100000\nduration = 315360000", "machine_nodes x local.duration"),
    ('state_dir = ""', "state_dir must not be empty"),
    ('state_dir = "a\\u0000b"', "state_dir contains a NUL byte"),
    ("[ports]\ncontrol = 5000\nagents = 5000", "same port twice"),
    ("local = 3", r"\[local\] must be a table"),
    ('"bad\\u001bkey" = 1', r"unknown key\(s\) 'bad\\x1bkey'"),
])
def test_config_errors_name_the_key(tmp_path: Path, text: str, why: str) -> None:
    f = tmp_path / "d.toml"
    f.write_text(text + "\n")
    with pytest.raises(ConfigError, match=why) as info:
        load_config(f)
    assert str(f) in str(info.value)


def test_undecodable_and_deep_config_files_name_the_file(tmp_path: Path) -> None:
    f = tmp_path / "d.toml"
    for data in (b"state_dir = \"caf\xe9\"\n", b"a = " + b"[" * 100_000 + b"]" * 100_000,
                 b"seed = " + b"9" * 10_000, b"# " + b"x" * (2 * 1024 * 1024)):
        f.write_bytes(data)
        with pytest.raises(ConfigError) as info:
            load_config(f)
        assert str(f) in str(info.value)


def test_effective_config_round_trips() -> None:
    cfg = DaemonConfig()
    assert parse_config(tomllib.loads(to_toml(cfg))) == cfg
    odd = parse_config({"state_dir": 'we"ird\\dir\tx\u00e9', "policy": {"tfwd_s": 1e-9, "prior": {"1": 5.0, "4": 18.0}},
                        "local": {"trace": "none", "seed": 0}})
    assert parse_config(tomllib.loads(to_toml(odd))) == odd


def test_config_check_prints_the_effective_config(tmp_path: Path) -> None:
    f = tmp_path / "d.toml"
    f.write_text('runtime = "toy"\n[local]\nnodes = 2\n')
    res = subprocess.run([sys.executable, "-m", "malletrain", "config", "check", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    cfg = parse_config(tomllib.loads(res.stdout))
    assert cfg.runtime == "toy" and cfg.local.nodes == 2 and cfg.policy == DaemonConfig().policy
    res = subprocess.run([sys.executable, "-m", "malletrain", "config", "check", str(f), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert json.loads(res.stdout)["local"]["nodes"] == 2
    f.write_text("[local]\ntrace = \"/no/such/trace.swf\"\n")
    res = subprocess.run([sys.executable, "-m", "malletrain", "config", "check", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "local.trace" in res.stderr and str(f) in res.stderr
    f.write_text("loop_interval = nan\n")
    res = subprocess.run([sys.executable, "-m", "malletrain", "config", "check", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "loop_interval must be a finite number" in res.stderr and "Traceback" not in res.stderr


# -- fuzzing ------------------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats()
           | st.text(max_size=12))
keys = st.sampled_from([k for table in LIMITS.values() for k in table]) | st.text(max_size=6)
tables = st.dictionaries(keys, scalars, max_size=6)
policy_keys = st.sampled_from(["tfwd_s", "max_running", "profiling", "profile_time_cap_s", "prior", "learn",
                               "method", "default_up_cost_s"]) | st.text(max_size=6)
policy_tables = st.dictionaries(policy_keys, scalars | st.dictionaries(st.text(max_size=3), scalars, max_size=3),
                                max_size=5)
configs = st.dictionaries(keys | st.sampled_from(["local", "ports", "policy", "metrics", "log"]),
                          scalars | tables | policy_tables,
                          max_size=8)


@settings(max_examples=500, deadline=None)
@given(configs)
def test_fuzz_config(obj: dict[str, object]) -> None:
    try:
        cfg = parse_config(obj, "fuzz")
    except ConfigError as exc:
        assert "fuzz" in str(exc)
        return
    assert parse_config(tomllib.loads(to_toml(cfg))) == cfg


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_config_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    f = tmp_path_factory.mktemp("cfg") / "d.toml"
    f.write_bytes(data)
    try:
        load_config(f)
    except ConfigError as exc:
        assert str(f) in str(exc)


def test_every_key_has_a_limit() -> None:
    from malletrain.daemon.config import TABLES, LocalConfig, LogConfig, MetricsConfig, Ports

    assert {f.name for f in fields(DaemonConfig)} - set(TABLES) == set(LIMITS[""])
    assert {f.name for f in fields(LocalConfig)} == set(LIMITS["local."])
    assert {f.name for f in fields(Ports)} == set(LIMITS["ports."])
    assert {f.name for f in fields(MetricsConfig)} == set(LIMITS["metrics."])
    assert {f.name for f in fields(LogConfig)} == set(LIMITS["log."])


@pytest.mark.parametrize("address, served", [
    ("127.0.0.1:9464", "127.0.0.1:9464"), ("9464", "127.0.0.1:9464"), (":0", "127.0.0.1:0"),
    ("[::1]:9464", "[::1]:9464"), ("localhost:1", "localhost:1"),
])
def test_metrics_address_is_parsed_with_loopback_by_default(address: str, served: str) -> None:
    from malletrain.daemon.metrics import parse_address

    cfg = parse_config({"metrics": {"address": address}})
    assert cfg.metrics.enabled and str(parse_address(cfg.metrics.address)) == served
    assert parse_config(tomllib.loads(to_toml(cfg))) == cfg


@pytest.mark.parametrize("table, why", [
    ({"metrics": {"address": "example.org:9464"}}, "metrics.address 'example.org:9464': host must be an IP"),
    ({"metrics": {"address": "127.0.0.1:99999"}}, "port must be an integer in [0, 65535]"),
    ({"metrics": {"address": "127.0.0.1:"}}, "port must be an integer"),
    ({"metrics": {"address": "::1:9464"}}, "in brackets"),
    ({"metrics": {"address": "0.0.0.0:9464"}}, "listens on every network"),
    ({"metrics": {"address": "[::]:9464"}}, "listens on every network"),
    ({"metrics": {"address": 9464}}, "metrics.address must be a string"),
    ({"metrics": {"port": 1}}, "unknown key(s) metrics.port"),
    ({"metrics": "on"}, "[metrics] must be a table"),
    ({"log": {"format": "xml"}}, "log.format must be one of text, json"),
    ({"log": {"level": "loud"}}, "log.level must be one of debug"),
])
def test_metrics_and_log_tables_refuse_bad_values_naming_the_key(table: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(table, "d.toml")
    assert why in str(info.value) and "d.toml" in str(info.value)


def test_metrics_are_off_and_the_log_is_text_by_default(tmp_path: Path) -> None:
    cfg = DaemonConfig()
    assert not cfg.metrics.enabled and cfg.log.format == "text" and cfg.log.level == "info"
    assert parse_config({"metrics": {"address": ""}}) == cfg
    f = tmp_path / "d.toml"
    f.write_text('[metrics]\naddress = "127.0.0.1:9464"\n[log]\nformat = "json"\n')
    res = subprocess.run([sys.executable, "-m", "malletrain", "config", "check", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    shown = tomllib.loads(res.stdout)
    assert shown["metrics"] == {"address": "127.0.0.1:9464"} and shown["log"] == {"format": "json", "level": "info"}


def test_ports_host_is_one_interface_address() -> None:
    from malletrain.daemon.config import ConfigError, parse_config

    assert parse_config({}).ports.host == "127.0.0.1"
    assert parse_config({"ports": {"host": "10.1.2.3"}}).ports.host == "10.1.2.3"
    for bad, why in (("0.0.0.0", "every network"), ("head-node", "IP address"), ("::1", "IPv4"), (5, "string")):
        with pytest.raises(ConfigError, match=why):
            parse_config({"ports": {"host": bad}})


def test_the_documented_config_shows_the_defaults_the_code_has() -> None:
    """Defaults are written once, in the dataclasses (``config_types``); the annotated config in
    ``malletrain/daemon/config.py``'s docstring (what ``--config`` help and the docs point at) must show
    those values, so a changed default cannot leave the documentation behind."""
    import textwrap

    import malletrain.daemon.config as config_module
    from malletrain.daemon.config import DaemonConfig

    doc = textwrap.dedent((config_module.__doc__ or "").split("\n", 2)[2])
    lines = []
    for line in doc.splitlines():  # the TOML sample: up to the first line of prose
        if line and not line.startswith((" ", "#", "[")) and "=" not in line:
            break
        lines.append(line)
    documented = tomllib.loads("\n".join(lines))
    examples = {"admin_groups", "trainers"}  # shown with example values (the defaults: none)

    def differences(prefix: str, table: dict, obj: object) -> list[str]:
        out = []
        for key, value in table.items():
            if key in examples:
                continue
            if isinstance(value, dict):
                out += differences(f"{prefix}{key}.", value, getattr(obj, key))
                continue
            default = getattr(obj, key)
            if (list(default) if isinstance(default, tuple) else default) != value:
                out.append(f"{prefix}{key}: documented {value!r}, default {default!r}")
        return out

    assert len(documented) > 10 and {"local", "policy", "scavenger", "ports", "metrics", "log"} <= set(documented)
    assert differences("", documented, DaemonConfig()) == []



def test_the_policy_table_has_one_loader_and_one_validation() -> None:
    """The daemon's [policy] table and ``malletrain simulate``'s are read by ``PolicyConfig.from_mapping``;
    knobs given over it (flags) are checked by ``PolicyConfig.overridden``, with the rules that tie knobs."""
    import pytest as _pytest

    from malletrain.daemon.config import ConfigError, parse_config
    from policy import PolicyConfig
    from policy.config import PolicyConfigError

    with _pytest.raises(ConfigError, match=r"policy\.max_running must be a finite number of at most 1e\+15"):
        parse_config({"policy": {"max_running": 10**20}})
    with _pytest.raises(PolicyConfigError, match=r"policy\.max_running must be a finite number of at most 1e\+15"):
        PolicyConfig.from_mapping({"max_running": 10**20})
    base = PolicyConfig()
    with _pytest.raises(PolicyConfigError, match=r"--max-running must be an integer in 0\.\.1000000, got -1"):
        base.overridden({"max_running": -1}, {"max_running": "--max-running"})
    with _pytest.raises(PolicyConfigError, match="a cap bounds adaptive admission only"):
        base.overridden({"admission": "fixed", "admission_cap": 5})
    assert base.overridden({"admission": "fixed"}).admission_cap == base.admission_cap  # the default cap is no cap given
    with _pytest.raises(PolicyConfigError, match="adaptive admission needs a Pjmax floor >= 1"):
        base.overridden({"max_running": 0})
    assert base.overridden({}) is base
