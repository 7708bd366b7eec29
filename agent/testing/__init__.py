"""Test doubles for what cannot exist on a machine without GPUs (used by tests and bench)."""
