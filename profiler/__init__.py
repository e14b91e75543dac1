"""Pure profiling: job-monitor records -> throughput and rescale costs; scalability model; inverse-order profiling plans.

    from profiler import Record, ThroughputEstimator, Scalability, ProfilingRequest, choose_sources, ProfileSession
"""

from profiler.estimators import (
    Estimate, RescaleCostEstimator, RescaleCosts, RescaleEvent, ThroughputEstimator, rescale_events, summarize_rescales,
    throughput_by_world_size
)
from profiler.jpa import (
    Done, Hold, ProfileCost, ProfilePlan, ProfileSession, ProfilingError, ProfilingRequest, RunningJob, Step, StepDown,
    StepKind, Wait, choose_sources, default_counts, profile_cost
)
from profiler.records import Record, RecordError, Segment, iter_records, synthesize
from profiler.scalability import (
    Scalability, ScalabilityError, ScalingModel, Source, curve_error_pct, fit_model, leave_one_out_errors, model_error,
    parse_scaling_table
)

__all__ = (
    "Done", "Estimate", "Hold", "ProfileCost", "ProfilePlan", "ProfileSession", "ProfilingError", "ProfilingRequest",
    "Record", "RecordError", "RescaleCostEstimator", "RescaleCosts", "RescaleEvent", "RunningJob", "Scalability",
    "ScalabilityError", "ScalingModel", "Segment", "Source", "Step", "StepDown", "StepKind", "ThroughputEstimator",
    "Wait", "choose_sources", "curve_error_pct", "default_counts", "fit_model", "iter_records", "leave_one_out_errors",
    "model_error", "parse_scaling_table", "profile_cost", "rescale_events", "summarize_rescales", "synthesize",
    "throughput_by_world_size"
)
