"""The pilot's engine: the Dr.GRPO trainer of one arm × seed (``trainer``) with its step's parts
and records, and its held-out evaluation (``evaluation``). The top wing of :mod:`evil_moe.rl`."""
