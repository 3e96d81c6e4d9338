"""rl: see docs/internals.md."""
