"""Test helpers that start real schedulers on this machine (not used by the daemon)."""
