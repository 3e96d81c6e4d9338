"""Arms: what one pilot trains on, and what it does to per-sample gradients and to the update.

An arm is a small class in one registry (:data:`ARMS`). The pilot's trainer
(:mod:`evil_moe.rl.trainer.trainer`) calls its hooks at fixed points of every step and never asks for
an arm by name; the compare stage asks each arm for its matched control, its role and its views.
The interface is :mod:`evil_moe.rl.arms.base` (:class:`Arm`, the flags, the split gradients); the arms
live by family in :mod:`evil_moe.rl.arms.by_projection` (erase, subtract and their controls),
:mod:`evil_moe.rl.arms.by_data` (route, filter, their controls and ceilings),
:mod:`evil_moe.rl.arms.by_reward` (the monitor penalty and inoculation prompting, with their
controls and ceiling), :mod:`evil_moe.rl.arms.by_advantage` (advantage_mod and its control) and
:mod:`evil_moe.rl.arms.reference` (vanilla, untrained, oracle_reward, moe). Adding an arm is one
class in its family's module, its entry in :data:`ARMS`, plus its tests.

Hooks (each optional; defaults do nothing):

* :meth:`Arm.instruction` — text appended to a problem's training prompt (inoculation; the
  held-out evaluation never gets it);
* :meth:`Arm.reward` — the reward of one graded completion (the loophole grade, or the oracle's
  pass for the positive control);
* :meth:`Arm.penalised` — a penalising arm's rewards: every rollout flagged before the
  advantages, the flagged ones' reward less the penalty (the monitor penalty);
* ``shortcut_rewards`` (arms with :attr:`Arm.shortcut`) — the rewards the group advantages are
  taken over, discounted by the rollouts' shortcut scores (Advantage Modification);
* :meth:`Arm.flags` — per-sample flags ``(B,)`` bool over the step's rows with gradient (route,
  filter and their random-flag controls), from the detector's scores;
* :meth:`Arm.split_gradients` — turn the per-sample gradients and flags into the gradients of
  ``δS`` and ``δS_hack`` (route: flagged samples train only ``δS_hack``; filter: flagged samples
  are dropped);
* :meth:`Arm.on_gradients` — act on the summed ``δS`` gradient before the optimiser step (erase,
  subtract, random V; ``pilot.projection: gradient`` or ``preconditioned``);
* :meth:`Arm.on_update` — act on the optimiser's update after the step
  (``pilot.projection: update``).

Views: the held-out evaluation of an arm samples with ``δS + δS_hack`` (``trained``) and, for
arms that train the quarantine knob ``δS_hack``, with it ablated (``ablated``, the deploy view
of Gradient Routing, Cloud et al. 2024, arXiv:2410.04332). ``views[0]`` is the view the gate
judges. Every arm is judged against vanilla's ``trained`` view and against its matched control's
same view (docs/gate.md).

The arms (docs/arms.md; docs/method.md, "Projection" and "Routing and filtering by data"):

============== ============ ============================================================= =====================
arm            role         what it does                                                  matched control
============== ============ ============================================================= =====================
vanilla        reference    Dr.GRPO on the environment's reward; measures only            —
erase          treatment    removes the hack-ward part (along v_hack) of the step         random_v
random_v       control      erase along a random orthonormal V (same k per module)        —
subtract       treatment    erase, and the removed part trains δS_hack (ablated at         subtract_random
                            deploy): vanilla plus a post-hoc subtraction, measured
subtract_random control     subtract along a random V                                     —
route          treatment    routing by data: detector-flagged samples train only δS_hack, route_dose_matched
                            the others only δS; the forward uses both; deploy ablates
route_random   control      route with flags drawn at random at the detector's rate       —
route_dose_    control      no flags: every rollout's gradient split alike at route's     —
matched                     per-step dose (its share of gradient energy to δS_hack)
filter         treatment    flagged samples are dropped from the loss (data filtering)   filter_random
filter_random  control      filter with random flags at the detector's rate              —
oracle_reward  positive     trained on the oracle's pass instead of the loophole; hacks  —
               control      less by construction (calibrates the gate's power)
route_oracle   ceiling      route with the true hack label as the flags (a perfect       route_oracle_dose_matched
                            detector): what route could achieve in this world
route_oracle_  control      route with random flags at route_oracle's per-step rate      —
random
route_oracle_  control      no flags: every rollout's gradient split alike at             —
dose_matched                route_oracle's per-step dose
filter_oracle  ceiling      filter with the true hack label as the flags                 filter_oracle_random
filter_oracle_ control      filter with random flags at filter_oracle's per-step rate    —
random
erase_planted  ceiling      erase along the planted hack direction (toy.plant only):     random_v
                            what erase achieves when V is exactly right
penalty        treatment    monitor penalty: rollouts the run's detector flags train on   penalty_random
                            reward − penalty.amount·pass_reward (progressive: × score)
penalty_random control      the penalty on random rollouts at penalty's per-step rate     —
penalty_oracle ceiling      the penalty with the true hack label as the flags             penalty_oracle_random
penalty_       control      the penalty on random rollouts at penalty_oracle's rate       —
oracle_random
inoculation    treatment    training prompts ask for the problem's loophole; held-out      inoculation_placebo
                            evaluation uses the plain prompt
inoculation_   control      a neutral instruction of the inoculation's length (chars)      —
placebo
advantage_mod  treatment    Advantage Modification (arXiv:2604.01476): each rollout's     advantage_mod_random
                            reward discounted by its mid-layer shortcut score (the
                            authored pairs' mean difference), rescaled within its group,
                            before the group baseline
advantage_mod_ control      advantage_mod along a random unit direction at the same      —
random                      layer
============== ============ ============================================================= =====================

Ceilings (role ``ceiling``) read the true hack label (``grade.exploited``); they are never a
treatment and no treatment reads them: the trainer hands the label to an arm only when it
declares :attr:`Arm.reads_label` (or ``pilot.detector`` is ``noisy_label``, the detector of
controlled quality). The report sets each treatment's drop beside its ceiling's
(:attr:`Arm.ceiling`).

Random-flag controls (:attr:`Arm.matches`) flag, at every step, as many of their own rows as
their matched arm flagged of its rows at that step (its ``steps.tsv``, a workflow input), with a
running balance that makes the per-seed mean flag rates agree within ``0.5 / (rows · steps)``
(:class:`FlagRateMatch`).

Advantages of the flagging arms (:meth:`Arm.baseline`): ``filter`` recomputes each group's
advantages over the rows it keeps (data filtering: a dropped row does not shape the others'
baseline); ``route`` does the same for its unflagged rows by default (``pilot.route_advantages:
kept``) and keeps the whole group's advantage for its flagged rows (they train ``δS_hack`` on the
unchanged loss) — :func:`kept_advantages`, docs/arms.md.
"""

from __future__ import annotations

from typing import Sequence

from evil_moe.rl.arms.base import Arm
from evil_moe.rl.arms.by_advantage import AdvantageMod, AdvantageModRandom
from evil_moe.rl.arms.by_data import (Filter, FilterOracle, FilterOracleRandom,
                                      FilterRandom, Route, RouteDoseMatched, RouteOracle, RouteOracleDose,
                                      RouteOracleDoseMatched, RouteOracleRandom, RouteRandom, MoEDoseMatched)
from evil_moe.rl.arms.by_projection import (Erase, ErasePlanted, RandomV, Subtract,
                                            SubtractRandom)
from evil_moe.rl.arms.by_reward import (Inoculation, InoculationPlacebo, Penalty, PenaltyOracle,
                                        PenaltyOracleRandom, PenaltyRandom)
from evil_moe.rl.arms.reference import MoE, MoERandom, OracleReward, Untrained, Vanilla

__all__ = ["ARMS", "get_arm", "arm_names", "check_arm_set"]


ARMS: dict[str, type[Arm]] = {cls.name: cls for cls in (
    Vanilla, Untrained, Erase, RandomV, Subtract, SubtractRandom, Route, RouteDoseMatched, RouteRandom, Filter,
    FilterRandom, MoE, MoEDoseMatched, MoERandom, OracleReward, RouteOracle, RouteOracleDoseMatched, RouteOracleRandom,
    RouteOracleDose, FilterOracle, FilterOracleRandom, ErasePlanted, Penalty, PenaltyRandom, PenaltyOracle,
    PenaltyOracleRandom, Inoculation, InoculationPlacebo, AdvantageMod,
    AdvantageModRandom)}


def arm_names() -> list[str]:
    """Every registered arm name, in registry order."""
    return list(ARMS)


def get_arm(name: str, *, pass_reward: float = 1.0) -> Arm:
    """An instance of the arm ``name``.

    Raises:
        ValueError: unknown arm (names it and lists the known ones).
    """
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; expected one of {arm_names()}")
    return ARMS[name](pass_reward=pass_reward)


def check_arm_set(arms: Sequence[str], positive_control: str | None = None) -> None:
    """Validate a configured arm set up front (``pilot.arms``).

    vanilla must be present (every arm is judged against it), untrained when a treatment is (every
    treatment must beat the student it starts from: the gate's criteria), every treatment's and ceiling's
    matched control must be present, every random-flag control's matched arm (whose flag rates it
    follows), and the positive control when one is configured.

    Raises:
        ValueError: one line naming what is missing.
    """
    arms = list(arms)
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm {unknown[0]!r} in pilot.arms; expected one of {arm_names()}")
    missing = []
    if "vanilla" not in arms:
        missing.append("vanilla (every arm is judged against it)")
    treatments = [a for a in arms if ARMS[a].role == "treatment"]
    if treatments and "untrained" not in arms:
        missing.append(f"untrained (every treatment must beat the untrained student: {treatments[0]})")
    for a in arms:
        c = ARMS[a].control
        if c and c not in arms:
            missing.append(f"{c} (the matched control of {a})")
        m = ARMS[a].matches
        if m and m not in arms:
            what = "deletes at its per-step dose" if ARMS[a].match_by == "dose" else "flags at its per-step rate"
            missing.append(f"{m} ({a} {what})")
    if positive_control and positive_control not in arms:
        missing.append(f"{positive_control} (compare.positive_control)")
    if missing:
        raise ValueError("pilot.arms is missing " + "; ".join(missing))
