"""evil_moe: stop reward hacking at the gradient level.

Erase or route the hack direction ``v_hack`` in an SVD adapter's singular-value space during
Dr.GRPO training (Dr.GRPO: arXiv:2503.20783; Gradient Routing: arXiv:2410.04332).
"""

__version__ = "0.1.0"
