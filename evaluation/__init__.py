"""The evaluation above the simulator: many replays as tasks (:mod:`evaluation.sweep`), policies x
workloads x seeds in model-neutral work (:mod:`evaluation.evaluate`, with its rows and targets in
:mod:`evaluation.results`, its regimes in :mod:`evaluation.regimes`, its pages, JSON and charts in
:mod:`evaluation.report`), one replay's files and plots (:mod:`evaluation.replay_report`) and the
trace figures (:mod:`evaluation.figures`). The simulator keeps the replay engine and never imports
this package; ``malletrain evaluate`` and ``malletrain simulate`` front it.
"""
