"""Test support, not product: real Slurm and OpenPBS test clusters started on this machine
(:mod:`testclusters.slurm_cluster`, :mod:`testclusters.pbs_cluster`), a scripted fake Slurm
(:mod:`testclusters.fake_slurm`) and connection floods (:mod:`testclusters.floods`), for tests/ and
benchmarks/. No product package imports it (tests/test_layers.py)."""
