"""The evaluation above the simulator (which never imports it): replays as tasks (``sweep``),
policies x workloads x seeds (``evaluate``; rows and targets in ``results``, regimes in
``regimes``, pages and charts in ``report``), one replay's files (``replay_report``) and the trace
figures (``figures``); ``malletrain evaluate`` and ``malletrain simulate`` front it.
"""
