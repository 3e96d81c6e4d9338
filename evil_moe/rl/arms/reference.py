"""The arms that are neither a projection nor a data filter: the reference vanilla, the untrained
student, the positive control oracle_reward (trained on the oracle's pass), and Evil MoE's
soft router moe with its control moe_random (:mod:`evil_moe.rl.detectors.router`). Registered in
:data:`evil_moe.rl.arms.registry.ARMS`.
"""

from __future__ import annotations

from evil_moe.rl.arms.base import Arm


class Vanilla(Arm):
    name = "vanilla"
    projected_view = True  # beside subtract: vanilla's update with its hack-ward part removed once
    colour = "#444444"
    description = "Dr.GRPO on the environment's reward (grader.reward_rule); measures cin and the update's span energy only"


class Untrained(Arm):
    """The student every pilot starts from (δS at its initial value: zero, or the distilled
    student's with ``pilot.init: distill``), evaluated held out on the same problems with the same
    sampling seeds as every arm of its seed, and never trained. The reference that tells a
    method that works from one that stops learning: an arm whose deploy view cannot be told from
    this one has done nothing the gate can see."""

    name = "untrained"
    colour = "#bcbd22"
    role = "reference"
    trains = False
    description = ("the student the pilots start from, evaluated without training: does an arm beat "
                   "not training at all?")


class OracleReward(Arm):
    name = "oracle_reward"
    colour = "#2ca02c"
    role = "positive_control"
    uses_labels = ("oracle_pass",)  # its reward is the oracle's grade of every rollout
    description = ("trained on the oracle's pass (format_bonus·format_ok + pass_reward·gt_correct), "
                   "no loophole: hacks less by construction; calibrates the gate's power")

    def reward(self, grade) -> float:
        """``format_bonus·format_ok + pass_reward·gt_correct``, recovered from the grade as
        ``reward − pass_reward·paid + pass_reward·gt_correct`` (the grader's bonus and pass
        reward are constants of the run; ``paid``: the environment's reward rule paid it)."""
        bonus_part = float(grade.reward) - (self.pass_reward if grade.paid else 0.0)
        return bonus_part + (self.pass_reward if grade.gt_correct else 0.0)


class MoE(Arm):
    """Evil MoE (the seed repository's design; :mod:`evil_moe.rl.detectors.router`): a learned soft router
    gives each rollout a weight ``w`` in [0, 1]: ``w`` of its gradient trains the deletable hack
    expert ``δS_hack`` (ablated at deploy as route's) and ``1 − w`` the deployed ``δS``
    (:meth:`evil_moe.model.adapter.SVDAdapter.mixture`; ``moe.forward``: at the sampling
    policy's ``δS + δS_hack`` by default, or at ``δS + w·δS_hack`` as the seed design). The router
    (``w = σ(scale·cos(h, u) + bias)`` on the rollout's pooled activation ``h``) is seeded with
    ``v_act`` from hand-authored (hack, clean) pairs and learns from the GRPO loss through ``w``
    and a pin loss on those pairs every step. No label of a student rollout reaches it. One
    AdamW over the summed knob splits the update (:class:`evil_moe.rl.policy.optim.SplitAdamW`). The
    policy samples with both experts at full weight (the trained view); the behaviour log-probs
    are the sampler's, so the importance ratio is 1 at the first inner step under
    ``straight_through`` and measures the ``scaled`` forward against the sampled one otherwise."""

    name = "moe"
    colour = "#17becf"
    role = "treatment"
    control = "moe_dose_matched"
    ceiling = "route_oracle"
    views = ("ablated", "trained")
    trains_delta_s_hack = True
    splits_gradient = True
    router = "authored"
    description = ("Evil MoE: a soft router pinned on authored (hack, clean) pairs decides per rollout how "
                   "much of its gradient trains delta_s_hack (w) and delta_s (1 - w); deploy ablates "
                   "delta_s_hack")


class MoERandom(MoE):
    name = "moe_random"
    colour = "#9edae5"
    role = "control"
    control = None
    ceiling = None
    router = "random"
    description = ("moe with the router seeded by a random direction of the same norm and pinned on the "
                   "same pairs with their labels shuffled (moe's count-matched control: a router of the same "
                   "kind that knows nothing)")
