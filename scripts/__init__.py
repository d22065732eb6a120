"""Maintenance scripts (not shipped in the wheel)."""
