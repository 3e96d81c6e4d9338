"""The hack detectors that decide which rollouts a flagging arm flags (``detector``), the
labelled-budget probe (``probe``) and Evil MoE's learned router (``router``). Above
:mod:`evil_moe.rl.vhack`."""
