"""The daemon: ONE reconcile loop, observe -> decide -> act.

Its parts (one file each), who calls whom, the one writer of each fact and the one path of a lost node
are described in docs/design.md ("The daemon's package"); restarts in docs/operators/operations.md."""

from malletrain.daemon.loop import Daemon
from malletrain.daemon.records import (
    CHECKPOINT_DIR, EXIT_STORE_LOST, LEAVE_GRACE_S, NODE_SECONDS_KEY, POLICY_STATE_KEY, REPLAN_S,
    START_RETRY_S, STATE_FILE, STOP_WAIT_S, STOPPED, STORE_FILE, DaemonError, JobRun, NodeLost, Trainer,
    rescale_kind, stopped_by_us, stopped_from_outside,
)
from malletrain.daemon.decide import policy_states_json, read_policy_states
from malletrain.daemon.wiring import DaemonParts, load_timeline, make_runtime

__all__ = [
    "CHECKPOINT_DIR", "EXIT_STORE_LOST", "LEAVE_GRACE_S", "NODE_SECONDS_KEY", "POLICY_STATE_KEY", "REPLAN_S",
    "START_RETRY_S", "STATE_FILE", "STOP_WAIT_S", "STOPPED", "STORE_FILE", "Daemon", "DaemonError", "DaemonParts",
    "JobRun", "NodeLost", "Trainer", "load_timeline", "make_runtime", "policy_states_json", "read_policy_states",
    "rescale_kind", "stopped_by_us", "stopped_from_outside",
]
