"""rl: the method, in wings read bottom up as the method runs (docs/internals.md, "Floors"):
:mod:`~evil_moe.rl.policy` (rollouts, the Dr.GRPO loss, the optimiser) → :mod:`~evil_moe.rl.vhack`
(the hack direction and projection along it) → :mod:`~evil_moe.rl.detectors` (which rollouts are
hacks) → :mod:`~evil_moe.rl.arms` (what each arm does with them) → :mod:`~evil_moe.rl.trainer`
(one arm × seed's training step and held-out evaluation). A wing imports only the wings below it."""
