"""The daemon's configuration file (TOML), validated with errors naming the key.

    state_dir = "~/.malletrain"      # store, control address, logs
    runtime = "torch"                # "torch" | "horovod" | "toy" (no torch: tests)
    loop_interval = 0.1              # seconds between reconcile iterations
    max_failures = 5                 # unexpected worker exits without progress before FAILED
    store_grace = 60.0               # torch workers train on this long without the daemon (restart)
    agent_heartbeat = 0.5            # seconds between agent heartbeats
    agent_dead_after = 10.0          # an agent (or the daemon) silent this long is gone; >= 2 heartbeats
    backend = "local"

    [local]
    nodes = 6
    trace = "synthetic"              # or a log file (see `malletrain trace`), or "none" (always idle)
    duration = 604800.0              # trace seconds of synthetic trace to generate
    machine_nodes = 64               # synthetic machine size; the local nodes are its first idle ones
    time_scale = 60.0                # trace seconds per wall second
    seed = 1

    [policy]                         # policy.PolicyConfig: the same knobs `malletrain simulate` replays
    tfwd_s = 120.0                   # allocator horizon Tfwd, seconds
    max_running = 10                 # Pjmax: jobs admitted at once, FCFS (0: no limit)
    profiling = "requested"          # "never" | "requested" (jobs with profile = true) | "always"
    profile_time_cap_s = 300.0       # seconds per profiled node count at most

    [ports]                          # 0: pick a free port (kept across restarts)
    control = 0
    agents = 0
    monitor = 0
    rendezvous = 0                   # the torch runtime's TCPStore

Every number has a range (:data:`LIMITS`); floats must be finite. ``malletrain
config check FILE`` prints the effective configuration (:func:`to_toml`).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from malletrain.textfile import decode_text
from policy import PolicyConfig, PolicyConfigError

RUNTIMES = ("torch", "horovod", "toy")
BACKENDS = ("local",)
CONFIG_FILE_MAX_BYTES = 1024 * 1024
PATH_MAX_BYTES = 4096
SYNTHETIC_MAX_NODE_SECONDS = 4608 * 604800 * 4
"""A synthetic trace's machine_nodes x duration at most (4 Summit weeks: built in a few seconds)."""


class ConfigError(ValueError):
    """A bad configuration; the message names the file and the key."""


@dataclass(frozen=True)
class LocalConfig:
    nodes: int = 6
    trace: str = "synthetic"
    time_scale: float = 60.0
    seed: int = 1
    duration: float = 7 * 86400.0
    machine_nodes: int = 64


@dataclass(frozen=True)
class Ports:
    control: int = 0
    agents: int = 0
    monitor: int = 0
    rendezvous: int = 0


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: str = "~/.malletrain"
    runtime: str = "torch"
    loop_interval: float = 0.1
    max_failures: int = 5
    store_grace: float = 60.0
    agent_heartbeat: float = 0.5
    agent_dead_after: float = 10.0
    backend: str = "local"
    local: LocalConfig = field(default_factory=LocalConfig)
    ports: Ports = field(default_factory=Ports)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    def with_state_dir(self, path: str | Path) -> "DaemonConfig":
        return replace(self, state_dir=str(path))


@dataclass(frozen=True)
class Limit:
    """The type and the inclusive range of one key."""

    kind: type
    low: float | None = None
    high: float | None = None


DAY = 86400.0
LIMITS: dict[str, dict[str, Limit]] = {
    "": {
        "state_dir": Limit(str), "runtime": Limit(str), "backend": Limit(str),
        "loop_interval": Limit(float, 0.001, 60.0),
        "max_failures": Limit(int, 1, 1_000_000), "store_grace": Limit(float, 0.1, DAY),
        "agent_heartbeat": Limit(float, 0.01, 60.0), "agent_dead_after": Limit(float, 0.1, DAY),
    },
    "local.": {
        "nodes": Limit(int, 1, 1024), "trace": Limit(str), "time_scale": Limit(float, 1e-9, 1e6),
        "seed": Limit(int, 0, 2**32 - 1), "duration": Limit(float, 1.0, 10 * 365 * DAY),
        "machine_nodes": Limit(int, 1, 100_000),
    },
    "ports.": {k: Limit(int, 0, 65535) for k in ("control", "agents", "monitor", "rendezvous")},
}


def _name(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(kind, str(kind))


def _check(where: str, key: str, value: Any, limit: Limit) -> Any:
    kind = limit.kind
    if isinstance(value, bool) or not isinstance(value, (float, int) if kind is float else kind):
        raise ConfigError(f"{where}: {key} must be {_name(kind)}, got {_short(value)}")
    if kind is float:
        try:
            value = float(value)
        except OverflowError:
            raise ConfigError(f"{where}: {key} must be a finite number, got an integer too large") from None
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
    if kind is str:
        return _text(where, key, value)
    if limit.low is not None and value < limit.low:
        raise ConfigError(f"{where}: {key} must be >= {limit.low:g}, got {_short(value)}")
    if limit.high is not None and value > limit.high:
        raise ConfigError(f"{where}: {key} must be <= {limit.high:g}, got {_short(value)}")
    return value


def _text(where: str, key: str, value: str) -> str:
    if not value:
        raise ConfigError(f"{where}: {key} must not be empty")
    if "\x00" in value:
        raise ConfigError(f"{where}: {key} contains a NUL byte")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigError(f"{where}: {key} is not valid Unicode") from None
    if size > PATH_MAX_BYTES:
        raise ConfigError(f"{where}: {key} is longer than {PATH_MAX_BYTES} bytes")
    return value


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int with more digits than Python prints
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _table(obj: dict[str, Any], where: str, prefix: str) -> dict[str, Any]:
    spec = LIMITS[prefix]
    unknown = set(obj) - set(spec)
    if unknown:
        names = ", ".join(prefix + (k if k.isprintable() else _short(k, 40)) for k in sorted(unknown))
        raise ConfigError(f"{where}: unknown key(s) {names}")
    return {k: _check(where, prefix + k, v, spec[k]) for k, v in obj.items()}


def _subtable(obj: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = obj.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: [{key}] must be a table")
    return value


MOVED_TO_POLICY = {"tfwd": "tfwd_s", "max_running": "max_running", "profile_time_cap": "profile_time_cap_s"}


def parse_config(obj: dict[str, Any], where: str = "config") -> DaemonConfig:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: a config must be a table")
    moved = {k: v for k, v in MOVED_TO_POLICY.items() if k in obj}
    if moved:
        raise ConfigError(f"{where}: " + "; ".join(f"{k} moved to [policy] {v}" for k, v in moved.items())
                          + " (the policy's knobs, shared with `malletrain simulate`)")
    top = {k: v for k, v in obj.items() if k not in ("local", "ports", "policy")}
    values = _table(top, where, "")
    if values.get("runtime", "torch") not in RUNTIMES:
        raise ConfigError(f"{where}: runtime must be one of {', '.join(RUNTIMES)}, got {values['runtime']!r}")
    if values.get("backend", "local") not in BACKENDS:
        raise ConfigError(f"{where}: backend must be one of {', '.join(BACKENDS)}, got {values['backend']!r}")
    lc = LocalConfig(**_table(_subtable(obj, "local", where), where, "local."))
    pc = Ports(**_table(_subtable(obj, "ports", where), where, "ports."))
    policy = _policy(_subtable(obj, "policy", where), where)
    cfg = DaemonConfig(**values, local=lc, ports=pc, policy=policy)
    _check_together(cfg, where)
    return cfg


POLICY_MAX_NUMBER = 1e15
"""Any number in [policy] at most this (no policy knob is anywhere near; huge ints overflow floats)."""


def _policy(table: dict[str, Any], where: str) -> PolicyConfig:
    """The [policy] table (policy.PolicyConfig checks its own keys); numbers must be finite and sane first."""
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        try:
            ok = math.isfinite(float(value)) and abs(value) <= POLICY_MAX_NUMBER
        except OverflowError:
            ok = False
        if not ok:
            name = key if isinstance(key, str) and key.isprintable() else _short(key, 40)
            raise ConfigError(f"{where}: policy.{name} must be a finite number of at most {POLICY_MAX_NUMBER:g}, "
                              f"got {_short(value)}")
    try:
        return PolicyConfig.from_mapping(table, "policy")
    except PolicyConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # a value PolicyConfig did not expect
        raise ConfigError(f"{where}: policy: bad value: {exc}") from None


def _check_together(cfg: DaemonConfig, where: str) -> None:
    """Rules between keys."""
    if cfg.agent_dead_after < 2 * cfg.agent_heartbeat:
        raise ConfigError(
            f"{where}: agent_dead_after ({cfg.agent_dead_after:g}) must be at least twice agent_heartbeat "
            f"({cfg.agent_heartbeat:g}): else one late heartbeat drops a healthy node"
        )
    if cfg.local.trace == "synthetic" and cfg.local.machine_nodes * cfg.local.duration > SYNTHETIC_MAX_NODE_SECONDS:
        raise ConfigError(
            f"{where}: local.machine_nodes x local.duration ({cfg.local.machine_nodes} x {cfg.local.duration:g} s) "
            f"must be <= {SYNTHETIC_MAX_NODE_SECONDS:g} node-seconds for a synthetic trace"
        )
    used = [p for p in asdict(cfg.ports).values() if p]
    if len(used) != len(set(used)):
        raise ConfigError(f"{where}: [ports] gives the same port twice: {asdict(cfg.ports)}")


def load_config(path: str | Path) -> DaemonConfig:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file not found: {p}") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    text = decode_text(p, data, CONFIG_FILE_MAX_BYTES, "config file", ConfigError)
    try:
        obj = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise ConfigError(f"{p}: bad value: {exc}") from None
    return parse_config(obj, str(p))


def check_files(cfg: DaemonConfig, where: str = "config") -> None:
    """Checks against the file system (``config check``, daemon start): the trace file exists."""
    if cfg.local.trace not in ("synthetic", "none") and not Path(cfg.local.trace).expanduser().is_file():
        raise ConfigError(f"{where}: local.trace {cfg.local.trace!r} is not 'synthetic', 'none' or an existing file")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    out = []
    for ch in str(value):
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def to_toml(cfg: DaemonConfig) -> str:
    """The whole configuration, defaults filled in, as TOML that :func:`parse_config` reads back."""
    lines = []
    for f in fields(cfg):
        if f.name not in ("local", "ports", "policy"):
            lines.append(f"{f.name} = {_toml_value(getattr(cfg, f.name))}")
    for section in ("local", "ports"):
        lines.append("")
        lines.append(f"[{section}]")
        sub = getattr(cfg, section)
        lines.extend(f"{f.name} = {_toml_value(getattr(sub, f.name))}" for f in fields(sub))
    lines += ["", "[policy]"]
    for key, value in cfg.policy.as_dict().items():
        if key == "prior":
            if value:
                lines.append("prior = { " + ", ".join(f'"{n}" = {r!r}' for n, r in value) + " }")
            continue
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def to_json(cfg: DaemonConfig) -> str:
    return json.dumps(asdict(cfg), indent=1)
