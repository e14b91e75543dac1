"""What the Slurm and the PBS daemon tests share: the agents' patience and a policy that never probes."""

from __future__ import annotations

from malletrain.daemon.config import DaemonConfig
from policy import PolicyConfig, Profiling

AGENT_DEAD_AFTER = DaemonConfig().agent_dead_after
"""The default (30 s), not less: an agent gives up after this long without a proven word from the daemon,
counted from its start. With both cores busy the daemon answered a new agent's handshake only after up to
10 s (and crossed challenges took another round), so with 10 s every pilot's agent gave up (daemon_lost),
its pilot failed and was replaced, again and again: the restart test saw new pilots, the walltime test a
suspended job."""


NO_PROBES = PolicyConfig(profiling=Profiling.REQUESTED)
"""The jobs here declare their curves and are never probed: a probe shrinks a job to fewer nodes when its
measures pay, at a time a test cannot know (the walltime test's job was once down to the node whose
notice came next, and left with no member)."""
