"""Pure allocator: elastic jobs + held nodes -> plan (node -> job map).

    from allocator import Job, Problem, solve
"""

from allocator.model import Job, Plan, Problem, ProblemError, throughput_at
from allocator.solve import METHODS, solve

__all__ = ["Job", "Plan", "Problem", "ProblemError", "METHODS", "solve", "throughput_at"]
