"""The daemon: ONE reconcile loop, observe -> decide -> act.

observe
    the scavenger backend (local, Slurm or PBS, through :class:`scavenger.base.SchedulerBackend`
    and :mod:`malletrain.daemon.scavenging`: pilots started / ending / ended, idle nodes, planned starts;
    nothing is decided on a stale look), node agents (up, gone,
    worker started/exited), the job monitor (progress, throughput, rescale
    pauses), the store (jobs submitted or cancelled by the CLI, even while the
    daemon was down) and control requests.
decide
    only calls the policy (:class:`policy.Policy`, the same code the simulator
    replays), once per trainer (``[[trainers]]``; none declared: one, ``default``):
    the trainer's view (its held usable nodes, its live jobs in submission order)
    and the monitor's evidence go in; the decision (admitted jobs and their
    nodes, waiting reasons, profiling counts) comes out, and each job's nodes are
    placed in the trainer's ledger (:class:`policy.Ledger`, the one record of which
    job runs on which nodes). A node belongs to the first trainer whose patterns match it (else
    the one without patterns), a job to the trainer it names (else the first).
    The policy states, one per trainer, are saved in the store after every
    decision that changed one, so a restart resumes profiles and lender debts. Decisions
    happen when something changed, at least every ``REPLAN_S``, and while a
    profile runs (its steps end on evidence).
act
    make the workers match each job's nodes in its trainer's ledger: start workers on new nodes (ahead of
    time), publish the new member list once they are ready, stop workers of
    nodes a job lost. Every action is idempotent (agents ignore duplicate
    starts/stops; a member list is published only when it differs).

A restart re-reads the store, waits ``agent_dead_after`` for the agents to
reconnect (they keep running their workers meanwhile), re-adopts the workers
they report and republishes each job's membership. The runtime's rendezvous
comes back on the port kept in the store, and each job's generation numbering
goes on from the last one published (kept in the store too), so running
``torch`` workers switch to the republished membership without losing a step.

A clean stop (:meth:`Daemon.close`) stops the workers but waits for them:
their last commit reaches the state dir and their last reports the store,
and the jobs are SUSPENDED ("daemon stopped"); a profile it interrupted
starts over at the next start. A daemon that finds the ``daemon.json`` of a
killed one, or an event log whose last start has no stop after it, waits
``agent_dead_after`` for surviving agents even with no job active. See "Restarts" in docs/operators/operations.md.

Runtime hooks are methods of :class:`malletrain.runtimes.Runtime` with no-op defaults:
``ready(job, worker)`` (a worker started ahead is ready to join), ``resume_generation(job, gen)``
(numbering goes on after a restart; the torch runtime also restores the job's checkpoint from
disk), ``readopt(job, command, workers)`` (take over a job an earlier daemon ran, e.g. a Horovod
driver), ``persist_checkpoints(jobs)`` (copy new checkpoints to the state dir; called every
iteration) and ``use_secrets(secret_for)`` (each job's own signing secret).

The package's files are the daemon's parts, plain classes given what they need when
:class:`Daemon` builds them (it has no base class):

=================  ==============================================================================
``loop.py``        :class:`Daemon`: builds the parts; the reconcile loop (``run``, ``step``), the sampler
``wiring.py``      :class:`.Wiring`: state-dir lock, store, sockets and ports, runtimes, backend; closing
``state.py``       :class:`.JobTable` (runs, trainers, nodes to release, adoption window), ``Plan``
``observe.py``     :class:`.Observe`: pilots, agents and their workers, progress, the store's new jobs
``intake.py``      :class:`.JobIntake`: a job from the store registered with the monitor, or refused
``adoption.py``    :class:`.Adoption`: the last daemon's jobs, the adoption window; holding idle nodes
``decide.py``      :class:`.Decide`: a policy and a ledger per trainer (the ledger builds the view)
``act.py``         :class:`.Act`: jobs and workers (start, publish, suspend, stop, end)
``api.py``         :class:`.ControlApi`: the control API (submit, cancel, status, nodes, shutdown)
``accounting.py``  :class:`.NodeAccounting`: node-seconds per job (budgets), kept in the store
``shutdown.py``    :class:`.Shutdown`: checkpoints and a clean stop
``sweeps.py``      :class:`.SweepDriver`: each ``[sweep]``'s trials asked of Optuna, submitted as jobs, told
``records.py``     :class:`JobRun`, :class:`Trainer`, :class:`.NodeLost`, constants, exit codes
=================  ==============================================================================

Who calls whom (an arrow: "calls"; no part calls back into one that calls it, and
``tests/test_daemon_shape.py`` holds it)::

    Daemon (loop) ──> Observe, Decide, Act, Adoption, ControlApi, Shutdown, Wiring, SweepDriver
    ControlApi ─────> Decide, SweepDriver (status)
    Shutdown ───────> Act, Observe
    Adoption ───────> Decide, Act, JobIntake
    Observe ────────> Decide, JobIntake
    Decide, Act, JobIntake, NodeAccounting, Wiring, SweepDriver: call no part

One step, as values: ``changed = observe(...)`` (pilots, agents, progress, the store, control
requests); ``wake = decide.decide(now)`` when something changed, a replan is due or a profile
runs; ``act.act(now, decide.plan())`` returns whether it ended or suspended a job. The "decide
again" flag is the loop's alone (a submit or cancel through the control API goes into the store and
is observed with the CLI's). A recall, followed one way: the scheduler's reply or the agent's
``leaving`` -> :meth:`.Observe.pilots` / :meth:`.Observe.agents` -> one :class:`.NodeLost` (the job
forgets its worker there; the loop is woken) -> :meth:`.Decide.feed_ledgers` (the node is no longer
usable: the ledger interrupts the job, once, however many events told of it) -> :meth:`.Decide.decide`
(the new plan) -> :meth:`.Act.act` (workers stopped there, the new member list published; the worker
switches). :meth:`.Decide.view` is a getter: it feeds nothing.

Each fact has one writer, seen while the daemon runs (``tests/test_daemon_writers.py``): a job's phase
(:class:`.records.JobPhase`, one table) changes by :meth:`JobRun.move` alone; act writes what it
publishes, observe what its workers reported, decide what the policy and the ledger say (``waiting``,
``suspended_by``), adoption the last daemon's nodes; the transitions of a job's phase, worker table,
progress, health and an end asked for are :class:`JobRun`'s own methods, which the parts call.
"""

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
