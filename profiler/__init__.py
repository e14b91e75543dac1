"""Pure profiling: job-monitor records -> throughput and rescale costs; inverse-order profiling plans."""
