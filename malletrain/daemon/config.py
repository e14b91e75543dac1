"""The daemon's configuration file (TOML), validated with errors naming the key.

    state_dir = "~/.malletrain"      # store, control address, logs
    runtime = "torch"                # "torch" | "horovod" | "toy" (no torch: tests)
    loop_interval = 0.1              # seconds between reconcile iterations
    max_failures = 5                 # unexpected worker exits without progress before FAILED
                                     # (two in a row before a first step: FAILED at once)
    stall_after = 600.0              # seconds without progress before a running job is stalled (a job
                                     # file's stall_after wins); restarted at twice that, from its checkpoint
    stall_restarts = 1               # restarts for a stall (no progress between) before the next fails it
    store_grace = 60.0               # torch workers train on this long without the daemon (restart)
    agent_heartbeat = 0.5            # seconds between agent heartbeats
    agent_dead_after = 30.0          # an agent (or the daemon) silent this long is gone; >= 2 heartbeats.
                                     # A restart must fit in it (agents keep their workers that long):
                                     # kill -> agents back took 5.2 s at load 12, 10.2 s with systemd's
                                     # RestartSec=5 (benchmarks/bench_daemon_start.py); the price of
                                     # more: a dead node is noticed later, and a restarted daemon waits
                                     # this + 1 s for the agents before it decides (docs/operators.md)
    backend = "local"                # the same as [scavenger] kind (give either)
    admin_groups = ["wheel"]         # may cancel any job and stop the daemon (besides root, its user); default none

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
    profiling = "gated"              # "never" | "requested" (profile = true) | "gated" (also when it pays) | "always"
    profile_time_cap_s = 300.0       # seconds per profiled node count at most

    [[trainers]]                     # optional: several trainers side by side (docs/operators.md: Several trainers)
    name = "vision"                  # 1-64 of A-Z a-z 0-9 _ . -; a job names it (`trainer = "vision"`)
    nodes = ["node0[0-1]"]           # fnmatch patterns over node names; the first trainer matching takes a node
    [trainers.policy]                # this trainer's [policy] keys (the rest: [policy]'s values)
    max_running = 1
    [[trainers]]
    name = "lm"                      # no nodes: every node no other trainer matched (one such trainer at most)
                                     # no [[trainers]]: one trainer "default" on every node with [policy]

    [scavenger]                      # who holds nodes: scavenger.local / .slurm / .pbs (docs/operators.md: Running on Slurm)
    kind = "local"                   # "local" | "slurm" | "pbs"; slurm/pbs below, [local] above for local
    partition = ""                   # slurm: the preemptable partition (or qos; at least one)
    qos = ""                         # slurm: a preemptable QOS
    account = ""                     # slurm/pbs: the account pilots are charged to
    queue = ""                       # pbs: the preemptable queue (preempt_order R or D; docs/operators/pbs.md)
    job_name = ""                    # tags our pilots (default malletrain-pilot / mt-pilot): unique per daemon
    nodes_per_pilot = 1              # nodes one pilot batch job holds
    walltime = 3600.0                # seconds a pilot asks for (a replacement takes over at the end)
    max_pilots = 20                  # pilots in flight at most (a centre's cap on jobs per user)
    renew_before = 120.0             # seconds before the walltime the node is handed to a replacement
    max_queued = 60.0                # cancel a pilot still queued this long (its node was taken)
    poll_interval = 1.0              # seconds between two looks at the scheduler (sinfo/squeue, pbsnodes/qstat)
    submit_rate = 2.0                # pilot submissions a second at most (bursts of 5), backoff on failures
    command_timeout = 15.0           # seconds before a hung scheduler command is killed
    workers_per_node = "gpus"        # worker slots per node: "gpus" (what Slurm's Gres / PBS's ngpus say, else 1) or an int

    [ports]                          # 0: pick a free port (kept across restarts)
    control = 0
    agents = 0
    monitor = 0
    rendezvous = 0                   # the torch runtime's TCPStore

    [metrics]                        # Prometheus (malletrain/daemon/metrics.py); needs `pip install malletrain[metrics]`
    address = ""                     # "127.0.0.1:9464" serves /metrics there; "" (default): off;
                                     # "9464" or ":9464" bind 127.0.0.1; the host must be an IP or localhost

    [log]                            # the daemon's log on stderr (malletrain/daemon/logs.py)
    format = "text"                  # "text" | "json" (one JSON object a line, with job/node/pilot fields)
    level = "info"                   # "debug" | "info" | "warning" | "error"

Every number has a range (:data:`LIMITS`); floats must be finite. ``malletrain
config check FILE`` prints the effective configuration (:func:`to_toml`).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

from malletrain.daemon.config_types import (  # noqa: F401  (the dataclasses and node_trainer: re-exported)
    DEFAULT_TRAINER, ConfigError, DaemonConfig, LocalConfig, LogConfig, MetricsConfig, Ports, ScavengerConfig,
    TrainerConfig, node_trainer,
)
from malletrain.daemon.control import admin_gids_from
from malletrain.daemon.jobspec import TRAINER_NAME
from malletrain.daemon.metrics import MetricsAddressError, parse_address
from malletrain.daemon.textfile import decode_text, short_repr as _short
from policy import PolicyConfig, PolicyConfigError
from contract.nodeshape import WORKERS_PER_NODE_GPUS, NodeShapeError, parse_workers_per_node

RUNTIMES = ("torch", "horovod", "toy")
BACKENDS = ("local", "slurm", "pbs")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TABLES = ("local", "ports", "policy", "metrics", "log", "scavenger", "trainers")
CONFIG_FILE_MAX_BYTES = 1024 * 1024
PATH_MAX_BYTES = 4096
TRAINERS_MAX = 64
TRAINER_PATTERNS_MAX = 1024
SYNTHETIC_MAX_NODE_SECONDS = 4608 * 604800 * 4
"""A synthetic trace's machine_nodes x duration at most (4 Summit weeks: built in a few seconds)."""


SCAVENGER_ONLY = {"partition": "slurm", "qos": "slurm", "queue": "pbs", "account": "slurm or pbs",
                  "job_name": "slurm or pbs"}
"""[scavenger] keys that mean something for these kinds only."""


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
        "stall_after": Limit(float, 1.0, 7 * DAY), "stall_restarts": Limit(int, 0, 1000),
        "agent_heartbeat": Limit(float, 0.01, 60.0), "agent_dead_after": Limit(float, 0.1, DAY),
        "admin_groups": Limit(list),  # each entry checked by _admin_groups
    },
    "local.": {
        "nodes": Limit(int, 1, 1024), "trace": Limit(str), "time_scale": Limit(float, 1e-9, 1e6),
        "seed": Limit(int, 0, 2**32 - 1), "duration": Limit(float, 1.0, 10 * 365 * DAY),
        "machine_nodes": Limit(int, 1, 100_000),
    },
    "ports.": {**{k: Limit(int, 0, 65535) for k in ("control", "agents", "monitor", "rendezvous")},
               "host": Limit(str)},
    "metrics.": {"address": Limit(str)},
    "log.": {"format": Limit(str), "level": Limit(str)},
    "scavenger.": {
        "kind": Limit(str), "partition": Limit(str), "qos": Limit(str), "account": Limit(str),
        "queue": Limit(str), "job_name": Limit(str), "nodes_per_pilot": Limit(int, 1, 10_000),
        "walltime": Limit(float, 60.0, 365 * DAY), "max_pilots": Limit(int, 1, 100_000),
        "renew_before": Limit(float, 0.0, DAY), "max_queued": Limit(float, 0.0, 365 * DAY),
        "poll_interval": Limit(float, 0.0, 600.0), "submit_rate": Limit(float, 0.001, 1000.0),
        "command_timeout": Limit(float, 0.1, 3600.0),
    },
}


def _name(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(kind, str(kind))


def _check(where: str, key: str, value: Any, limit: Limit) -> Any:
    kind = limit.kind
    if isinstance(value, bool) or not isinstance(value, (float, int) if kind is float else kind):
        raise ConfigError(f"{where}: {key} must be {_name(kind)}, got {_short(value)}")
    if kind is float:
        try:
            value = float(cast(float, value))  # an int or a float (checked above)
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
    top = {k: v for k, v in obj.items() if k not in TABLES and k != "admin_groups"}
    values = _table(top, where, "")
    values["admin_groups"] = _admin_groups(obj.get("admin_groups", []), where)
    if values.get("runtime", DaemonConfig.runtime) not in RUNTIMES:
        raise ConfigError(f"{where}: runtime must be one of {', '.join(RUNTIMES)}, got {values['runtime']!r}")
    if values.get("backend", DaemonConfig.backend) not in BACKENDS:
        raise ConfigError(f"{where}: backend must be one of {', '.join(BACKENDS)}, got {values['backend']!r}")
    lc = LocalConfig(**_table(_subtable(obj, "local", where), where, "local."))
    pc = Ports(**_table(_subtable(obj, "ports", where), where, "ports."))
    _check_host(pc.host, where)
    policy_table = _subtable(obj, "policy", where)
    policy = _policy(policy_table, where)
    trainers = _trainers(obj.get("trainers"), policy_table, where)
    metrics = _metrics(_subtable(obj, "metrics", where), where)
    scav = _scavenger(_subtable(obj, "scavenger", where), values.get("backend"), where)
    values["backend"] = scav.kind
    logc = _log(_subtable(obj, "log", where), where)
    cfg = DaemonConfig(**values, local=lc, ports=pc, policy=policy, metrics=metrics, log=logc, scavenger=scav,
                       trainers=trainers)
    _check_together(cfg, where)
    return cfg


def _admin_groups(raw: Any, where: str) -> tuple[str | int, ...]:
    """``admin_groups``: at most 64 group names or gids (names are looked up by :func:`check_files`)."""
    if not isinstance(raw, list) or len(raw) > 64:
        raise ConfigError(f"{where}: admin_groups must be a list of at most 64 group names or gids, got {_short(raw)}")
    for i, g in enumerate(raw):
        if isinstance(g, str):
            _text(where, f"admin_groups[{i}]", g)
        elif isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < 2**32:
            raise ConfigError(f"{where}: admin_groups[{i}] must be a group name or a gid, got {_short(g)}")
    return tuple(raw)


def _check_host(host: str, where: str) -> None:
    """ports.host: an IPv4 address of one of this machine's interfaces, or localhost; not a wildcard."""
    import ipaddress

    if host == "localhost":
        return
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{where}: ports.host must be an IP address (or localhost), got {_short(host, 60)}") from None
    if addr.version != 4:
        raise ConfigError(f"{where}: ports.host {host}: only IPv4 addresses are supported")
    if addr.is_unspecified:
        raise ConfigError(f"{where}: ports.host {host} listens on every network; give the address of the one "
                          "the compute nodes share")


def _scavenger(table: dict[str, Any], backend: str | None, where: str) -> ScavengerConfig:
    """[scavenger]: ``kind`` (or the top-level ``backend``, which must agree) and that kind's keys."""
    table = dict(table)
    shape = table.pop("workers_per_node", WORKERS_PER_NODE_GPUS)
    try:
        parse_workers_per_node(shape, "scavenger.workers_per_node")
    except NodeShapeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    values = _table({k: v for k, v in table.items() if v != "" or k == "kind"}, where, "scavenger.")
    values["workers_per_node"] = shape
    kind = values.get("kind", backend or "local")
    if kind not in BACKENDS:
        raise ConfigError(f"{where}: scavenger.kind must be one of {', '.join(BACKENDS)}, got {_short(kind)}")
    if backend is not None and "kind" in values and backend != kind:
        raise ConfigError(f"{where}: backend = {backend!r} and scavenger.kind = {kind!r} disagree (give one)")
    values["kind"] = kind
    for key, kinds in SCAVENGER_ONLY.items():
        if key in values and kind not in kinds.split(" or "):
            raise ConfigError(f"{where}: scavenger.{key} applies to kind = {kinds} only (kind is {kind!r})")
    if kind == "slurm" and not (values.get("partition") or values.get("qos")):
        raise ConfigError(f"{where}: scavenger.partition (or scavenger.qos) is required for kind = \"slurm\": "
                          "the preemptable partition pilots run in")
    if kind == "pbs" and not values.get("queue"):
        raise ConfigError(f"{where}: scavenger.queue is required for kind = \"pbs\": the preemptable queue")
    if kind != "local" and values.get("renew_before", ScavengerConfig.renew_before) >= \
            values.get("walltime", ScavengerConfig.walltime):
        raise ConfigError(f"{where}: scavenger.renew_before must be less than scavenger.walltime")
    return ScavengerConfig(**values)


def _metrics(table: dict[str, Any], where: str) -> MetricsConfig:
    """[metrics]: ``address`` empty (off) or a valid ``host:port``."""
    rest = {k: v for k, v in table.items() if not (k == "address" and v == "")}
    values = _table(rest, where, "metrics.")
    if "address" in values:
        try:
            parse_address(values["address"])
        except MetricsAddressError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return MetricsConfig(**values)


def _log(table: dict[str, Any], where: str) -> LogConfig:
    values = _table(table, where, "log.")
    for key, allowed in (("format", LOG_FORMATS), ("level", LOG_LEVELS)):
        if key in values and values[key] not in allowed:
            raise ConfigError(f"{where}: log.{key} must be one of {', '.join(allowed)}, got {_short(values[key])}")
    return LogConfig(**values)


TRAINER_KEYS = ("name", "nodes", "policy")


def _trainers(raw: Any, policy_table: dict[str, Any], where: str) -> tuple[TrainerConfig, ...]:
    """``[[trainers]]``: unique names, at most one trainer without ``nodes``; each ``policy``
    subtable over the ``[policy]`` table's values."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"{where}: trainers must be an array of tables ([[trainers]]), got {_short(raw)}")
    if len(raw) > TRAINERS_MAX:
        raise ConfigError(f"{where}: {len(raw)} trainers; at most {TRAINERS_MAX}")
    out = tuple(_trainer(t, f"trainers[{i}]", policy_table, where) for i, t in enumerate(raw))
    seen: dict[str, int] = {}
    catch_all: list[int] = []
    for i, t in enumerate(out):
        if t.name in seen:
            raise ConfigError(f"{where}: trainers[{i}].name {t.name!r} is also trainers[{seen[t.name]}]'s")
        seen[t.name] = i
        if t.nodes is None:
            catch_all.append(i)
    if len(catch_all) > 1:
        raise ConfigError(f"{where}: trainers[{catch_all[1]}].nodes is missing, as trainers[{catch_all[0]}]'s: "
                          "one trainer at most takes the nodes no other matched")
    return out


def _trainer(table: dict[str, Any], key: str, policy_table: dict[str, Any], where: str) -> TrainerConfig:
    unknown = sorted(k if k.isprintable() else _short(k, 40) for k in table if k not in TRAINER_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(key + '.' + k for k in unknown)}; "
                          f"known: {', '.join(TRAINER_KEYS)}")
    name = table.get("name")
    if not isinstance(name, str) or not TRAINER_NAME.fullmatch(name):
        raise ConfigError(f"{where}: {key}.name must be 1-64 of A-Z a-z 0-9 _ . -, got {_short(name)}")
    nodes = _patterns(table["nodes"], f"{key}.nodes", where) if "nodes" in table else None
    sub = table.get("policy", {})
    if not isinstance(sub, dict):
        raise ConfigError(f"{where}: {key}.policy must be a table")
    return TrainerConfig(name, nodes, _policy({**policy_table, **sub}, where, f"{key}.policy"))


def _patterns(raw: Any, key: str, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) and p for p in raw):
        raise ConfigError(f"{where}: {key} must be a non-empty list of node name patterns "
                          f"(e.g. [\"node0[0-2]\"]), got {_short(raw)}")
    if len(raw) > TRAINER_PATTERNS_MAX:
        raise ConfigError(f"{where}: {key} has {len(raw)} patterns; at most {TRAINER_PATTERNS_MAX}")
    return tuple(_text(where, f"{key}[{i}]", p) for i, p in enumerate(raw))


def _policy(table: dict[str, Any], where: str, key: str = "policy") -> PolicyConfig:
    """The [policy] table, checked by :meth:`policy.PolicyConfig.from_mapping` (the loader ``malletrain simulate``
    uses too); ``key``: the table's name in errors (``trainers[0].policy`` for a trainer's)."""
    try:
        return PolicyConfig.from_mapping(table, key)
    except PolicyConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # a value PolicyConfig did not expect
        raise ConfigError(f"{where}: {key}: bad value: {exc}") from None


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
    try:
        admin_gids_from(cfg.admin_groups)
    except ValueError as exc:
        raise ConfigError(f"{where}: admin_groups: {exc}") from None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
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
        if f.name not in TABLES:
            lines.append(f"{f.name} = {_toml_value(getattr(cfg, f.name))}")
    for section in ("local", "ports", "metrics", "log", "scavenger"):
        lines.append("")
        lines.append(f"[{section}]")
        sub = getattr(cfg, section)
        lines.extend(f"{f.name} = {_toml_value(getattr(sub, f.name))}" for f in fields(sub))
    lines += ["", "[policy]", *_policy_lines(cfg.policy)]
    for t in cfg.trainers:
        lines += ["", "[[trainers]]", f"name = {_toml_value(t.name)}"]
        if t.nodes is not None:
            lines.append(f"nodes = {_toml_value(t.nodes)}")
        lines += ["[trainers.policy]", *_policy_lines(t.policy)]
    return "\n".join(lines) + "\n"


def _policy_lines(pc: PolicyConfig) -> list[str]:
    lines = []
    for key, value in pc.as_dict().items():
        if key == "prior":
            if value:
                lines.append("prior = { " + ", ".join(f'"{n}" = {r!r}' for n, r in value) + " }")
            continue
        if key == "user_weights":  # a table of user = weight (names quoted: any login name)
            lines.append("user_weights = { " + ", ".join(f"{_toml_value(u)} = {w!r}" for u, w in value.items()) + " }")
            continue
        lines.append(f"{key} = {_toml_value(value)}")
    return lines


def to_json(cfg: DaemonConfig) -> str:
    return json.dumps(asdict(cfg), indent=1)

