"""simulator."""
