"""The policy and its update: rollouts sampled (``rollout``, ``vllm_sampler``) or drawn from the
teacher (``teacher_rows``), the Dr.GRPO loss (``grpo``) and the optimiser (``optim``). The lowest
wing of :mod:`evil_moe.rl`."""
