"""Pure allocator: elastic jobs + held nodes -> plan (node -> job map).

    from allocator import Job, Problem, solve
"""

from allocator.model import Job, Plan, Problem, ProblemError
from allocator.solve import METHODS, solve
from allocator.values import RowMemo
from curves import throughput_at  # re-exported: the allocator's objective reads curves through it

__all__ = ("Job", "Plan", "Problem", "ProblemError", "METHODS", "RowMemo", "solve", "throughput_at")
