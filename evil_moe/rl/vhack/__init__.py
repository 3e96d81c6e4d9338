"""The hack direction ``v_hack``: (hack, clean) pairs (``pairs``), their gradients and the
extraction (``direction``, ``stack``), its honesty checks (``checks``), the planted world's known
direction (``planted``) and projection along it (``projection``). Above :mod:`evil_moe.rl.policy`."""
