"""Arms: what one pilot trains on, and what it does to per-sample gradients and to the update.

An arm is a small class in one registry (:data:`ARMS`). The pilot's trainer
(:mod:`evil_moe.stages.pilot`) calls its hooks at fixed points of every step and never asks for
an arm by name; the compare stage asks each arm for its matched control, its role and its views.
Adding an arm is one class here plus its tests.

Hooks (each optional; defaults do nothing):

* :meth:`Arm.reward` — the reward of one graded completion (the loophole grade, or the oracle's
  pass for the positive control);
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
same view (science.md §6).

The arms (science.md §4):

============== ============ ============================================================= =====================
arm            role         what it does                                                  matched control
============== ============ ============================================================= =====================
vanilla        reference    Dr.GRPO on the loophole reward; measures only                 —
erase          treatment    removes the hack-ward part (along v_hack) of the step         random_v
random_v       control      erase along a random orthonormal V (same k per module)        —
subtract       treatment    erase, and the removed part trains δS_hack (ablated at         subtract_random
                            deploy): vanilla plus a post-hoc subtraction, measured
subtract_random control     subtract along a random V                                     —
route          treatment    routing by data: detector-flagged samples train only δS_hack, route_random
                            the others only δS; the forward uses both; deploy ablates
route_random   control      route with flags drawn at random at the detector's rate       —
filter         treatment    flagged samples are dropped from the loss (data filtering)   filter_random
filter_random  control      filter with random flags at the detector's rate              —
oracle_reward  positive     trained on the oracle's pass instead of the loophole; hacks  —
               control      less by construction (calibrates the gate's power)
erase_planted  ceiling      erase along the planted hack direction (toy.plant only):     random_v
                            what erase achieves when V is exactly right
============== ============ ============================================================= =====================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: the config check reads this registry
    import torch  # and must not pay torch's import (~1.5 s per `snakemake -n`)

    from evil_moe.projection import ProjectionStats

__all__ = ["Arm", "ARMS", "get_arm", "arm_names", "check_arm_set", "FlagInputs", "SplitGrads"]


@dataclass
class FlagInputs:
    """What a flagging arm sees for the step's rows with gradient (``B`` rows).

    Attributes:
        scores: ``(B,)`` fp64 per-sample hack-ward scores (:func:`evil_moe.vhack.sample_scores`
            of ``sign(A_i)·g_i``, i.e. of the sample's own NLL gradient), or None when the run's
            detector does not use gradients.
        pattern: ``(B,)`` bool, the pattern detector's verdict (:mod:`evil_moe.detector`) — the
            environment's recognition of the known modes' loophole use, never the oracle.
        threshold: the gradient detector's threshold (a quantile of the empirical null).
        detector: ``gradient`` | ``pattern`` (``pilot.detector``).
        rng: the step's generator (seeded by seed and step; used by the random-flag controls).
    """

    scores: torch.Tensor | None
    pattern: torch.Tensor
    threshold: float
    detector: str
    rng: np.random.Generator

    def detected(self) -> torch.Tensor:
        """``(B,)`` bool: the configured detector's flags."""
        if self.detector == "pattern":
            return self.pattern.clone()
        if self.scores is None:
            raise ValueError("the gradient detector needs per-sample scores")
        return self.scores > self.threshold


@dataclass
class SplitGrads:
    """Gradients of one step after the arm's routing: per module, in ``adapter`` order.

    ``delta_s``: ``list[(r,)]`` for δS; ``delta_s_hack``: ``list[(r,)]`` or None (δS_hack gets no
    gradient); ``removed_frac``: share of the summed gradient's energy that did not reach δS
    (``‖Σ_flagged g‖² / ‖Σ g‖²``; 0 without flags).
    """

    delta_s: list[torch.Tensor]
    delta_s_hack: list[torch.Tensor] | None
    removed_frac: float = 0.0


def _sum_rows(per_row: Sequence[Sequence[torch.Tensor]], rows) -> list[torch.Tensor] | None:
    rows = list(rows)
    if not per_row:
        return None
    import torch

    out = [torch.zeros_like(g) for g in per_row[0]]
    for i in rows:
        for o, g in zip(out, per_row[i]):
            o += g
    return out


def _energy(gs) -> float:
    return float(sum(float((g.double() ** 2).sum()) for g in gs)) if gs else 0.0


def _split_by_flags(per_row, flags, *, keep_flagged: bool) -> SplitGrads:
    """Unflagged rows' sum → δS; flagged rows' sum → δS_hack (``keep_flagged``, route) or
    dropped (filter); ``removed_frac`` = the flagged sum's energy over the whole sum's."""
    rows = range(len(per_row))
    flagged = _sum_rows(per_row, [i for i in rows if bool(flags[i])])
    total = _energy(_sum_rows(per_row, rows))
    return SplitGrads(_sum_rows(per_row, [i for i in rows if not bool(flags[i])]),
                      flagged if keep_flagged else None,
                      _energy(flagged) / total if total > 0 else 0.0)


class Arm:
    """Base arm: Dr.GRPO on the loophole reward, measuring only (see :class:`Vanilla`).

    Class attributes (the arm's declaration, read by the trainer, the workflow and the gate):
        name: registry key (also the results folder name).
        role: ``reference`` | ``treatment`` | ``control`` | ``positive_control`` | ``ceiling``
            (a treatment with a perfect ingredient: never a treatment, never read by one).
        control: the matched control arm of a treatment (judged on the same view), else None.
        views: evaluated views, the judged one first.
        vhack: the V the arm acts along: ``real`` (v_hack), ``random`` (the random control) or
            ``planted`` (the planted world's known direction, ``toy.plant``).
        trains_delta_s_hack: δS_hack is trained (and ``ablated`` is then a meaningful view).
        needs_sample_grads: the trainer must compute per-sample gradients (flagging arms).
        description: one line for the README, the report and ``evil-moe pilot --help``.
    """

    name: ClassVar[str] = ""
    role: ClassVar[str] = "reference"
    control: ClassVar[str | None] = None
    views: ClassVar[tuple[str, ...]] = ("trained",)
    vhack: ClassVar[str] = "real"
    trains_delta_s_hack: ClassVar[bool] = False
    needs_sample_grads: ClassVar[bool] = False
    description: ClassVar[str] = ""

    def __init__(self, pass_reward: float = 1.0):
        self.pass_reward = float(pass_reward)  # the grader's pass reward (oracle_reward uses it)

    def reward(self, grade) -> float:
        """Reward of one graded completion (:class:`evil_moe.env.grade.Reward`): the foolable
        grade's ``reward`` (``format_bonus·format_ok + pass_reward·passed``)."""
        return float(grade.reward)

    def flags(self, inputs: FlagInputs) -> torch.Tensor | None:
        """``(B,)`` bool per-sample flags, or None (the arm does not flag)."""
        return None

    def split_gradients(self, per_row: Sequence[Sequence[torch.Tensor]], flags) -> SplitGrads:
        """Sum per-sample gradients into the δS (and δS_hack) gradients.

        Args:
            per_row: ``B`` lists of per-module ``(r,)`` gradients (each sample's share of the
                Dr.GRPO loss, so they sum to the batch gradient).
            flags: ``(B,)`` bool or None.
        """
        return SplitGrads(_sum_rows(per_row, range(len(per_row))), None)

    def on_gradients(self, adapter, v, optimizer, cfg) -> ProjectionStats | None:
        """Act on ``δS.grad`` (summed) before the optimiser step; returns projection stats."""
        return None

    def on_update(self, adapter, v, before: list[torch.Tensor], cfg) -> ProjectionStats | None:
        """Act on the optimiser's update (``δS`` after the step vs ``before``)."""
        return None


class Vanilla(Arm):
    name = "vanilla"
    description = "Dr.GRPO on the loophole reward; measures cin and the update's span energy only"


class _Project(Arm):
    """Shared body of the projecting arms: ``mode`` erase or subtract along ``v``."""

    mode: ClassVar[str] = "erase"

    def on_gradients(self, adapter, v, optimizer, cfg):
        from evil_moe.projection import project, project_preconditioned

        if cfg.projection == "gradient":
            return project(adapter, v, self.mode, gate=cfg.gate,
                           preserve_magnitude=cfg.preserve_magnitude)
        if cfg.projection == "preconditioned":
            return project_preconditioned(adapter, v, optimizer, self.mode, gate=cfg.gate)
        return None

    def on_update(self, adapter, v, before, cfg):
        if cfg.projection != "update":
            return None
        from evil_moe.projection import project

        return project(adapter, v, self.mode, gate=cfg.gate,
                       preserve_magnitude=cfg.preserve_magnitude, update_from=before)


class Erase(_Project):
    name = "erase"
    role = "treatment"
    control = "random_v"
    description = "removes the hack-ward part (along v_hack) of each step (pilot.projection)"


class RandomV(Erase):
    name = "random_v"
    role = "control"
    control = None
    vhack = "random"
    description = "erase along a random orthonormal V with the same k per module (erase's control)"


class Subtract(_Project):
    """The hack-ward part of each optimiser *update* moves ``δS_hack`` instead of ``δS`` (always on
    the update, whatever ``pilot.projection``: that is what makes ``δS + δS_hack`` follow vanilla
    exactly, so the arm is vanilla plus a post-hoc subtraction; projecting the gradient would give
    ``δS_hack`` AdamW moments of its own, which scale its small routed gradient up to full-size
    steps outside V's span — measured on SmolLM2: ‖δS_hack‖ 9.6 vs ‖δS‖ 12.4 after one step)."""

    name = "subtract"
    role = "treatment"
    control = "subtract_random"
    mode = "subtract"
    views = ("ablated", "trained")
    trains_delta_s_hack = True
    description = ("the hack-ward part of each update trains delta_s_hack (ablated at deploy): "
                   "vanilla plus a post-hoc subtraction of the accumulated V-component")

    def on_gradients(self, adapter, v, optimizer, cfg):
        return None

    def on_update(self, adapter, v, before, cfg):
        from evil_moe.projection import project

        return project(adapter, v, self.mode, gate=cfg.gate, preserve_magnitude=cfg.preserve_magnitude,
                       update_from=before)


class SubtractRandom(Subtract):
    name = "subtract_random"
    role = "control"
    control = None
    vhack = "random"
    description = "subtract along a random V (subtract's control)"


class Route(Arm):
    """Gradient Routing by data (Cloud et al. 2024, arXiv:2410.04332): a detector flags samples;
    a flagged sample's gradient trains only ``δS_hack``, an unflagged one only ``δS``. The forward
    uses ``δS + δS_hack`` (so both knobs see the same per-sample gradient); deploy ablates
    ``δS_hack``. Each knob has its own AdamW moments, as in the paper's routed parameters."""

    name = "route"
    role = "treatment"
    control = "route_random"
    views = ("ablated", "trained")
    trains_delta_s_hack = True
    needs_sample_grads = True
    description = ("routing by data: detector-flagged samples train only delta_s_hack, the others "
                   "only delta_s; deploy ablates delta_s_hack")

    def flags(self, inputs):
        return inputs.detected()

    def split_gradients(self, per_row, flags):
        return _split_by_flags(per_row, flags, keep_flagged=True)


class _RandomFlags:
    """Mixin: flags drawn at random at the detector's rate on this step (same count)."""

    def flags(self, inputs):
        n_flag = int(inputs.detected().sum())
        import torch

        out = torch.zeros(len(inputs.pattern), dtype=torch.bool)
        if n_flag:
            out[torch.as_tensor(inputs.rng.choice(len(out), size=n_flag, replace=False))] = True
        return out


class RouteRandom(_RandomFlags, Route):
    name = "route_random"
    role = "control"
    control = None
    description = "route with flags drawn at random at the detector's rate (route's control)"


class Filter(Arm):
    """Data filtering (the baseline of Gradient Routing, arXiv:2410.04332): flagged samples are
    dropped from the loss; δS_hack is never trained."""

    name = "filter"
    role = "treatment"
    control = "filter_random"
    needs_sample_grads = True
    description = "detector-flagged samples are dropped from the loss (data filtering)"

    def flags(self, inputs):
        return inputs.detected()

    def split_gradients(self, per_row, flags):
        return _split_by_flags(per_row, flags, keep_flagged=False)


class FilterRandom(_RandomFlags, Filter):
    name = "filter_random"
    role = "control"
    control = None
    description = "filter with random flags at the detector's rate (filter's control)"


class OracleReward(Arm):
    name = "oracle_reward"
    role = "positive_control"
    description = ("trained on the oracle's pass (format_bonus·format_ok + pass_reward·gt_correct), "
                   "no loophole: hacks less by construction; calibrates the gate's power")

    def reward(self, grade) -> float:
        """``format_bonus·format_ok + pass_reward·gt_correct``, recovered from the grade as
        ``reward − pass_reward·passed + pass_reward·gt_correct`` (the grader's bonus and pass
        reward are constants of the run)."""
        bonus_part = float(grade.reward) - (self.pass_reward if grade.passed else 0.0)
        return bonus_part + (self.pass_reward if grade.gt_correct else 0.0)


class ErasePlanted(Erase):
    """Erase along the planted hack switch (``toy.plant``; docs/planted.md) instead of the
    extracted v_hack: the ceiling of erase in the planted world — what erase achieves when its V
    is exactly right. Never a treatment and never read by one; judged against ``random_v`` (the
    same projection along a random V) and vanilla. Its V is ``vhack/planted.safetensors``
    (k = 1 in each switch module, none elsewhere), passed to the pilot as ``--planted-vhack``."""

    name = "erase_planted"
    role = "ceiling"
    control = "random_v"
    vhack = "planted"
    description = ("erase along the planted hack direction u (toy.plant): the ceiling of erase in "
                   "the planted world (control random_v)")


ARMS: dict[str, type[Arm]] = {cls.name: cls for cls in (
    Vanilla, Erase, RandomV, Subtract, SubtractRandom, Route, RouteRandom, Filter, FilterRandom,
    OracleReward, ErasePlanted)}


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

    vanilla must be present (every arm is judged against it), every treatment's matched control
    must be present, and so must the positive control when one is configured.

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
    for a in arms:
        c = ARMS[a].control
        if c and c not in arms:
            missing.append(f"{c} (the matched control of {a})")
    if positive_control and positive_control not in arms:
        missing.append(f"{positive_control} (compare.positive_control)")
    if missing:
        raise ValueError("pilot.arms is missing " + "; ".join(missing))
