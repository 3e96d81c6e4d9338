"""Which rollouts are hacks: the detectors' declarations, one class each, in one registry
(``registry``: what each needs, how it scores, flags, is thresholded and audited), their
arithmetic (``detector``), the labelled-budget probe (``probe``) and Evil MoE's learned router
(``router``). Above :mod:`evil_moe.rl.vhack`."""
