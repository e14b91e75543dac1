"""scavenger."""
