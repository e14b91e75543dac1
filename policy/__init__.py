"""Pure: the one place decisions are made (admission, profiling, lending, curves, costs, allocation).

    from policy import Policy, PolicyConfig, View, JobView, JobEvidence
    decision = Policy(PolicyConfig()).decide(View(now, free_nodes, jobs), evidence)

Imports only :mod:`allocator`, :mod:`profiler`, numpy and the standard library: no clock, no I/O.
The daemon and the simulator both drive it (see ``docs/design.md``).
"""

from policy.config import PRESETS, Admission, Allocation, CostSource, Fairness, PolicyConfig, PolicyConfigError, \
    Horizon, Objective, Profiling, preset
from policy.decide import Policy, evidence_from, profile_counts
from policy.queueview import unplaced_reasons
from policy.ledger import Ledger, LedgerError, Loss, LossOutcome, below_min, interrupts, loss_outcome
from policy.model import NO_EVIDENCE, Decision, EventKind, Evidence, JobEvidence, JobView, PolicyEvent, \
    PolicyInputError, Stop, StopReason, View
from policy.state import Debt, PolicyState, PolicyStateError

__all__ = (
    "Admission", "Horizon", "Objective", "Allocation", "CostSource", "Fairness", "Debt", "Decision", "EventKind",
    "Evidence", "JobEvidence", "JobView", "Ledger", "LedgerError", "Loss", "LossOutcome", "NO_EVIDENCE", "PRESETS",
    "Policy", "PolicyConfig", "PolicyConfigError", "PolicyEvent", "PolicyInputError", "PolicyState", "PolicyStateError",
    "Profiling", "Stop", "StopReason", "View", "evidence_from", "below_min", "interrupts", "loss_outcome", "preset",
    "profile_counts", "unplaced_reasons",
)
