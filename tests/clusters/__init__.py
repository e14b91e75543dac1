"""Test support, not product: real Slurm and OpenPBS test clusters started on this machine
(:mod:`tests.clusters.slurm_cluster`, :mod:`tests.clusters.pbs_cluster`, sharing
:mod:`tests.clusters.common`), a scripted fake Slurm (:mod:`tests.clusters.fake_slurm`), connection
floods (:mod:`tests.clusters.floods`) and a whole elastic job without the daemon
(:mod:`tests.clusters.localjob`), for tests/ and benchmarks/ (which put the repository on
``sys.path``). Outside the installed packages; no product package imports it (tests/test_layers.py)."""
