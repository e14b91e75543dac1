"""The daemon's configuration file (TOML), validated with errors naming the key.

    state_dir = "~/.malletrain"      # store, control address, logs
    runtime = "torch"                # "torch" | "horovod" | "toy" (no torch: tests)
    tfwd = 60.0                      # allocator horizon Tfwd, seconds
    max_running = 0                  # at most this many jobs hold nodes (0: no limit)
    loop_interval = 0.1              # seconds between reconcile iterations
    profile_time_cap = 30.0          # seconds per profiled node count at most
    max_failures = 5                 # unexpected worker exits without progress before FAILED
    store_grace = 60.0               # torch workers train on this long without the daemon (restart)
    backend = "local"

    [local]
    nodes = 6
    trace = "synthetic"              # or a log file (see `malletrain trace`), or "none" (always idle)
    duration = 604800.0              # trace seconds of synthetic trace to generate
    machine_nodes = 64               # synthetic machine size; the local nodes are its first idle ones
    time_scale = 60.0                # trace seconds per wall second
    seed = 1

    [ports]                          # 0: pick a free port (kept across restarts)
    control = 0
    agents = 0
    monitor = 0
    rendezvous = 0                   # the torch runtime's TCPStore
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

RUNTIMES = ("torch", "horovod", "toy")
BACKENDS = ("local",)


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
    tfwd: float = 60.0
    max_running: int = 0
    loop_interval: float = 0.1
    profile_time_cap: float = 30.0
    max_failures: int = 5
    store_grace: float = 60.0
    agent_heartbeat: float = 0.5
    agent_dead_after: float = 10.0
    backend: str = "local"
    local: LocalConfig = field(default_factory=LocalConfig)
    ports: Ports = field(default_factory=Ports)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    def with_state_dir(self, path: str | Path) -> "DaemonConfig":
        return replace(self, state_dir=str(path))


def _check(where: str, key: str, value: Any, kind: type | tuple[type, ...], low: float | None = None) -> Any:
    if isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{where}: {key} must be {_name(kind)}, got {value!r}")
    if kind is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, kind):
        raise ConfigError(f"{where}: {key} must be {_name(kind)}, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{where}: {key} must be >= {low:g}, got {value!r}")
    return value


def _name(kind: type | tuple[type, ...]) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(kind, str(kind))  # type: ignore[arg-type]


def _table(obj: dict[str, Any], where: str, prefix: str, spec: dict[str, tuple[type, float | None]]) -> dict[str, Any]:
    unknown = set(obj) - set(spec)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(prefix + k for k in sorted(unknown))}")
    return {k: _check(where, prefix + k, v, *spec[k]) for k, v in obj.items()}


_TOP = {
    "state_dir": (str, None), "runtime": (str, None), "tfwd": (float, 1e-9), "max_running": (int, 0),
    "loop_interval": (float, 0.001), "profile_time_cap": (float, 0.1), "max_failures": (int, 1),
    "store_grace": (float, 0.1), "agent_heartbeat": (float, 0.01), "agent_dead_after": (float, 0.1),
    "backend": (str, None),
}
_LOCAL = {"nodes": (int, 1), "trace": (str, None), "time_scale": (float, 1e-9), "seed": (int, 0),
          "duration": (float, 1.0), "machine_nodes": (int, 1)}
_PORTS = {"control": (int, 0), "agents": (int, 0), "monitor": (int, 0), "rendezvous": (int, 0)}


def parse_config(obj: dict[str, Any], where: str = "config") -> DaemonConfig:
    top = {k: v for k, v in obj.items() if k not in ("local", "ports")}
    values = _table(top, where, "", _TOP)
    if values.get("runtime", "torch") not in RUNTIMES:
        raise ConfigError(f"{where}: runtime must be one of {', '.join(RUNTIMES)}, got {values['runtime']!r}")
    if values.get("backend", "local") not in BACKENDS:
        raise ConfigError(f"{where}: backend must be one of {', '.join(BACKENDS)}, got {values['backend']!r}")
    local, ports = obj.get("local", {}), obj.get("ports", {})
    if not isinstance(local, dict):
        raise ConfigError(f"{where}: [local] must be a table")
    if not isinstance(ports, dict):
        raise ConfigError(f"{where}: [ports] must be a table")
    lc = LocalConfig(**_table(local, where, "local.", _LOCAL))
    pc = Ports(**_table(ports, where, "ports.", _PORTS))
    for k in _PORTS:
        if getattr(pc, k) > 65535:
            raise ConfigError(f"{where}: ports.{k} must be <= 65535, got {getattr(pc, k)}")
    return DaemonConfig(**values, local=lc, ports=pc)


def load_config(path: str | Path) -> DaemonConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file not found: {p}") from None
    try:
        obj = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(obj, str(p))
