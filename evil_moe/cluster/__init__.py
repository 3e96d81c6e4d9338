"""cluster: see docs/internals.md."""
