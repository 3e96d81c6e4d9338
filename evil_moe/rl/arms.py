"""Arms: what one pilot trains on, and what it does to per-sample gradients and to the update.

An arm is a small class in one registry (:data:`ARMS`). The pilot's trainer
(:mod:`evil_moe.rl.trainer`) calls its hooks at fixed points of every step and never asks for
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
route_oracle   ceiling      route with the true hack label as the flags (a perfect       route_oracle_random
                            detector): what route could achieve in this world
route_oracle_  control      route with random flags at route_oracle's per-step rate      —
random
filter_oracle  ceiling      filter with the true hack label as the flags                 filter_oracle_random
filter_oracle_ control      filter with random flags at filter_oracle's per-step rate    —
random
erase_planted  ceiling      erase along the planted hack direction (toy.plant only):     random_v
                            what erase achieves when V is exactly right
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

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: the config check reads this registry
    import torch  # and must not pay torch's import (~1.5 s per `snakemake -n`)

    from evil_moe.rl.projection import ProjectionStats

__all__ = ["Arm", "ARMS", "get_arm", "arm_names", "check_arm_set", "FlagInputs", "SplitGrads",
           "FlagRateMatch", "kept_advantages", "ROLES"]

ROLES = ("reference", "treatment", "control", "positive_control", "ceiling")


@dataclass
class FlagInputs:
    """What a flagging arm sees for the step's rows with gradient (``B`` rows).

    Attributes:
        scores: ``(B,)`` fp64 per-sample hack-ward scores (:func:`evil_moe.rl.vhack.sample_scores`
            of ``sign(A_i)·g_i``, i.e. of the sample's own NLL gradient), or None when the run's
            detector does not use gradients.
        pattern: ``(B,)`` bool, the pattern detector's verdict (:mod:`evil_moe.rl.detector`) — the
            environment's recognition of the known modes' loophole use, never the oracle.
        threshold: the gradient detector's threshold (a quantile of the empirical null).
        detector: ``gradient`` | ``pattern`` | ``noisy_label`` (``pilot.detector``).
        rng: the step's generator (seeded by seed and step; used by the random-flag controls
            and the noisy-label detector).
        label: ``(B,)`` bool, the true hack label (``grade.exploited``) — given only to arms
            that declare :attr:`Arm.reads_label` (the ceilings) and to the ``noisy_label``
            detector; None otherwise, so no treatment under the gradient or pattern detector
            can read it.
        precision, recall: the ``noisy_label`` detector's quality (``pilot.detector_precision``,
            ``pilot.detector_recall``).
        target_count: the number of rows a random-flag control flags at this step
            (:class:`FlagRateMatch`); None for other arms.
    """

    scores: torch.Tensor | None
    pattern: torch.Tensor
    threshold: float
    detector: str
    rng: np.random.Generator
    label: torch.Tensor | None = None
    precision: float = 1.0
    recall: float = 1.0
    target_count: int | None = None

    def detected(self) -> torch.Tensor:
        """``(B,)`` bool: the configured detector's flags.

        Raises:
            ValueError: the gradient detector without scores; the noisy-label detector without
                the label.
        """
        if self.detector == "pattern":
            return self.pattern.clone()
        if self.detector == "noisy_label":
            from evil_moe.rl.detector import noisy_label_flags

            if self.label is None:
                raise ValueError("the noisy_label detector needs the true hack label")
            return noisy_label_flags(self.label, self.precision, self.recall, self.rng)
        if self.scores is None:
            raise ValueError("the gradient detector needs per-sample scores")
        return self.scores > self.threshold


class FlagRateMatch:
    """How many rows a random-flag control flags at each step, so that its flag rate follows its
    matched arm's per step and their per-seed mean flag rates agree.

    The matched arm's per-step flag rates ``rates[s]`` (its ``steps.tsv`` ``flag_rate``; None at a
    step without rows with gradient, where its per-seed mean ``r̄`` is the target) are the
    targets. A running balance ``b`` (targets minus achieved rates so far) is paid back spread over
    the ``N − s`` steps left: at step ``s`` with ``n`` rows the control flags
    ``k = clip(round((t_s + b/(N − s))·n), 0, n)`` rows and keeps ``b ← b + t_s − k/n``; at a step
    without rows it keeps ``b ← b + t_s − r̄`` (that step's target is not logged by either arm's
    mean). The last step pays the whole balance, so (unless the clip binds)
    ``|mean_c − r̄| = |b_end| / L ≤ 0.5 / (n_last · L)`` over the control's ``L`` logged steps:
    the per-seed mean flag rates differ by at most that (0.021 / L with 24 rows per step).
    Matching per step keeps the flags' timing too (a detector flags more as the policy hacks
    more).

    A matched arm that had no rows with gradient at any step flagged nothing, so its rate is
    taken as 0 and the control flags nothing either (a tiny or degenerate run, e.g. the CI
    config's two steps).

    Args:
        rates: the matched arm's per-step flag rates in [0, 1] (None = no rows that step), one per
            step.

    Raises:
        ValueError: a rate outside [0, 1].
    """

    def __init__(self, rates: Sequence[float | None]):
        self.rates = [None if r is None else float(r) for r in rates]
        present = [r for r in self.rates if r is not None]
        if any(not 0.0 <= r <= 1.0 for r in present):
            raise ValueError(f"flag rates must be in [0, 1], got {present}")
        self.mean = float(np.mean(present)) if present else 0.0
        self.balance = 0.0

    def target(self, step: int) -> float:
        """The matched arm's flag rate at ``step`` (its mean where it had none)."""
        r = self.rates[step] if 0 <= step < len(self.rates) else None
        return self.mean if r is None else r

    def count(self, step: int, n_rows: int) -> int:
        """Rows to flag out of ``n_rows`` at ``step``; updates the balance (call once per step)."""
        t = self.target(step)
        if n_rows <= 0:
            self.balance += t - self.mean
            return 0
        left = max(len(self.rates) - step, 1)
        k = int(min(max(round((t + self.balance / left) * n_rows), 0), n_rows))
        self.balance += t - k / n_rows
        return k

    @staticmethod
    def read(path) -> list[float | None]:
        """The per-step ``flag_rate`` column of a pilot's ``steps.tsv`` (None where empty).

        Raises:
            FileNotFoundError: no such file (names it). ValueError: no ``flag_rate`` column.
        """
        import csv
        from pathlib import Path

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"matched arm's steps file not found: {path}")
        with path.open() as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if rows and "flag_rate" not in rows[0]:
            raise ValueError(f"{path}: no flag_rate column")
        rows.sort(key=lambda r: int(r["step"]))
        return [float(r["flag_rate"]) if r["flag_rate"] not in ("", None) else None for r in rows]


def kept_advantages(rewards, kept, scale_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """Group advantages recomputed over the kept rows only (true data filtering).

    ``A'_{pg} = R_{pg} − mean_{h ∈ kept(p)} R_{ph}`` for a kept row (``/ (std_kept + eps)`` with
    ``scale_std``, the unbiased std over the kept rows, 0 when fewer than two); 0 for a row that is
    not kept, and 0 in a group whose kept rows all have the same reward (Dr.GRPO,
    arXiv:2503.20783, applied to the data a filter leaves).

    Args:
        rewards: ``(P, G)`` rewards.
        kept: ``(P, G)`` bool (True = the row stays in the loss).
        scale_std, eps: as :func:`evil_moe.rl.grpo.group_advantages`.

    Returns:
        ``(P, G)`` advantages, the dtype of :func:`evil_moe.rl.grpo.group_advantages`.

    Raises:
        ValueError: shapes differ or are not 2-D.
    """
    import torch

    R = torch.as_tensor(rewards)
    R = R.to(torch.float64 if R.dtype == torch.float64 else torch.float32)
    K = torch.as_tensor(kept, dtype=torch.bool)
    if R.dim() != 2 or R.shape != K.shape:
        raise ValueError(f"rewards {tuple(R.shape)} and kept {tuple(K.shape)} must be the same (P, G)")
    out = torch.zeros_like(R)
    for p in range(R.shape[0]):
        r = R[p][K[p]]
        if r.numel() == 0 or bool((r == r[0]).all()):
            continue
        a = r - r.mean()
        if scale_std:
            a = a / (r.std() + eps)
        out[p][K[p]] = a
    return out


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
        control: the matched control arm of a treatment or a ceiling (same view), else None.
        ceiling: the ceiling arm a treatment is set beside in the report (route: route_oracle),
            else None.
        matches: for a random-flag control, the arm whose per-step flag rates it matches
            (:class:`FlagRateMatch`), else None.
        reads_label: the arm's flags are the true hack label (ceilings only).
        views: evaluated views, the judged one first.
        projected_view: with ``pilot.static_projection`` the arm is also evaluated in the view
            ``projected`` (its final δS with the hack-ward part of its total update removed once:
            the static counterpart of ``subtract``); see :meth:`eval_views`.
        static_twin: ``(arm, view)`` whose held-out outcomes this arm's judged view should
            coincide with if the arm is only a post-hoc subtraction (``subtract``: vanilla's
            ``projected`` view); compare notes the difference. None for every other arm.
        vhack: the V the arm acts along: ``real`` (v_hack), ``random`` (the random control) or
            ``planted`` (the planted world's known direction, ``toy.plant``).
        trains_delta_s_hack: δS_hack is trained (and ``ablated`` is then a meaningful view).
        needs_sample_grads: the trainer must compute per-sample gradients (flagging arms).
        description: one line for the README, the report and ``evil-moe pilot --help``.
        colour: the arm's colour in every figure (matplotlib ``#rrggbb``; distinct across arms),
            or None for the figure's fallback colour.
    """

    name: ClassVar[str] = ""
    role: ClassVar[str] = "reference"
    control: ClassVar[str | None] = None
    ceiling: ClassVar[str | None] = None
    matches: ClassVar[str | None] = None
    reads_label: ClassVar[bool] = False
    views: ClassVar[tuple[str, ...]] = ("trained",)
    projected_view: ClassVar[bool] = False
    static_twin: ClassVar[tuple[str, str] | None] = None
    vhack: ClassVar[str] = "real"
    trains_delta_s_hack: ClassVar[bool] = False
    needs_sample_grads: ClassVar[bool] = False
    description: ClassVar[str] = ""
    colour: ClassVar[str | None] = None

    def __init__(self, pass_reward: float = 1.0):
        self.pass_reward = float(pass_reward)  # the grader's pass reward (oracle_reward uses it)

    def eval_views(self, cfg) -> tuple[str, ...]:
        """The views the held-out evaluation samples, in order: :attr:`views`, then ``projected``
        when the arm declares :attr:`projected_view` and ``cfg.static_projection`` is set
        (``cfg`` is the pilot section)."""
        return tuple(self.views) + (("projected",) if self.projected_view and cfg.static_projection else ())

    def reward(self, grade) -> float:
        """Reward of one graded completion (:class:`evil_moe.env.grader.Reward`): the foolable
        grade's ``reward`` (``format_bonus·format_ok + pass_reward·passed``)."""
        return float(grade.reward)

    def flags(self, inputs: FlagInputs) -> torch.Tensor | None:
        """``(B,)`` bool per-sample flags, or None (the arm does not flag)."""
        return None

    def baseline(self, cfg) -> str:
        """Which rows' rewards the group baseline of the step's advantages is taken over, once
        the flags are known: ``group`` (every row of the group: the advantages computed before
        flagging) or ``kept`` (the unflagged rows only, :func:`kept_advantages`; flagged rows
        keep the whole group's advantage). ``cfg`` is the pilot section."""
        return "group"

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
    projected_view = True  # beside subtract: vanilla's update with its hack-ward part removed once
    colour = "#444444"
    description = "Dr.GRPO on the loophole reward; measures cin and the update's span energy only"


class _Project(Arm):
    """Shared body of the projecting arms: ``mode`` erase or subtract along ``v``."""

    mode: ClassVar[str] = "erase"

    def on_gradients(self, adapter, v, optimizer, cfg):
        from evil_moe.rl.projection import project, project_preconditioned

        if cfg.projection == "gradient":
            return project(adapter, v, self.mode, gate=cfg.gate,
                           preserve_magnitude=cfg.preserve_magnitude)
        if cfg.projection == "preconditioned":
            return project_preconditioned(adapter, v, optimizer, self.mode, gate=cfg.gate)
        return None

    def on_update(self, adapter, v, before, cfg):
        if cfg.projection != "update":
            return None
        from evil_moe.rl.projection import project

        return project(adapter, v, self.mode, gate=cfg.gate,
                       preserve_magnitude=cfg.preserve_magnitude, update_from=before)


class Erase(_Project):
    name = "erase"
    colour = "#1f77b4"
    role = "treatment"
    control = "random_v"
    description = "removes the hack-ward part (along v_hack) of each step (pilot.projection)"


class RandomV(Erase):
    name = "random_v"
    colour = "#9ecae1"
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
    colour = "#9467bd"
    role = "treatment"
    control = "subtract_random"
    mode = "subtract"
    views = ("ablated", "trained")
    static_twin = ("vanilla", "projected")
    trains_delta_s_hack = True
    description = ("the hack-ward part of each update trains delta_s_hack (ablated at deploy): "
                   "vanilla plus a post-hoc subtraction of the accumulated V-component")

    def on_gradients(self, adapter, v, optimizer, cfg):
        return None

    def on_update(self, adapter, v, before, cfg):
        from evil_moe.rl.projection import project

        return project(adapter, v, self.mode, gate=cfg.gate, preserve_magnitude=cfg.preserve_magnitude,
                       update_from=before)


class SubtractRandom(Subtract):
    name = "subtract_random"
    colour = "#c5b0d5"
    role = "control"
    control = None
    static_twin = None
    vhack = "random"
    description = "subtract along a random V (subtract's control)"


class Route(Arm):
    """Gradient Routing by data (Cloud et al. 2024, arXiv:2410.04332): a detector flags samples;
    a flagged sample's gradient trains only ``δS_hack``, an unflagged one only ``δS``. The forward
    uses ``δS + δS_hack`` (so both knobs see the same per-sample gradient); deploy ablates
    ``δS_hack``. Each knob has its own AdamW moments, as in the paper's routed parameters.

    Advantages (``pilot.route_advantages``, :meth:`baseline`): ``kept`` (default) — the unflagged
    rows' advantages are recomputed over the unflagged rows of their group
    (:func:`kept_advantages`), so ``δS`` learns from the step as if the flagged rows had not been
    sampled; the flagged rows keep the whole group's advantage and train ``δS_hack`` on the
    unchanged loss (recomputing theirs among the flagged rows alone would give a group of equal
    hack rewards zero advantage, and ``δS_hack`` would absorb nothing). ``group`` — every row keeps
    the whole group's advantage (the loss is unchanged and only its gradient is masked, as in the
    paper's supervised setting); with a GRPO baseline that leaks: the flagged rows' (high) rewards
    raise the baseline of every unflagged row, so ``δS`` learns to move away from the clean
    completions, which is hack-ward. Measured with the true label as the flags (issue 19):
    deploy-view hack rate 0.059 with ``kept`` against 0.105 with ``group`` (vanilla 0.367)."""

    name = "route"
    colour = "#d62728"
    role = "treatment"
    control = "route_random"
    ceiling = "route_oracle"
    views = ("ablated", "trained")
    trains_delta_s_hack = True
    needs_sample_grads = True
    description = ("routing by data: detector-flagged samples train only delta_s_hack, the others "
                   "only delta_s; deploy ablates delta_s_hack")

    def flags(self, inputs):
        return inputs.detected()

    def baseline(self, cfg) -> str:
        return cfg.route_advantages

    def split_gradients(self, per_row, flags):
        return _split_by_flags(per_row, flags, keep_flagged=True)


class _RandomFlags:
    """Mixin: ``target_count`` flags at random positions (the matched arm's per-step rate,
    :class:`FlagRateMatch`); never reads the detector or the label."""

    def flags(self, inputs):
        import torch

        if inputs.target_count is None:
            raise ValueError(f"{self.name} flags at its matched arm's rate ({self.matches}): "
                             "target_count missing (run_pilot's match_flags)")
        out = torch.zeros(len(inputs.pattern), dtype=torch.bool)
        n_flag = int(inputs.target_count)
        if not 0 <= n_flag <= len(out):
            raise ValueError(f"target_count {n_flag} outside [0, {len(out)}]")
        if n_flag:
            out[torch.as_tensor(inputs.rng.choice(len(out), size=n_flag, replace=False))] = True
        return out


class _LabelFlags:
    """Mixin of the ceilings: the flags are the true hack label."""

    reads_label = True

    def flags(self, inputs):
        if inputs.label is None:
            raise ValueError(f"{self.name} needs the true hack label")
        return inputs.label.clone()


class RouteRandom(_RandomFlags, Route):
    name = "route_random"
    colour = "#ff9896"
    role = "control"
    control = None
    ceiling = None
    matches = "route"
    description = "route with flags at random positions at route's per-step flag rate (route's control)"


class RouteOracle(_LabelFlags, Route):
    name = "route_oracle"
    colour = "#8c1d1d"
    role = "ceiling"
    control = "route_oracle_random"
    ceiling = None
    description = ("ceiling: route with the true hack label as the flags (a perfect detector); "
                   "never a treatment")


class RouteOracleRandom(_RandomFlags, Route):
    name = "route_oracle_random"
    colour = "#e7a1a1"
    role = "control"
    control = None
    ceiling = None
    matches = "route_oracle"
    description = "route with random flags at route_oracle's per-step flag rate (the ceiling's control)"


class Filter(Arm):
    """Data filtering (the baseline of Gradient Routing, arXiv:2410.04332): flagged samples are
    dropped from the loss and the kept rows' group advantages are recomputed over the kept rows
    (:func:`kept_advantages`: a dropped row does not shape the others' baseline); δS_hack is never
    trained."""

    name = "filter"
    colour = "#ff7f0e"
    role = "treatment"
    control = "filter_random"
    ceiling = "filter_oracle"
    needs_sample_grads = True
    description = ("detector-flagged samples are dropped from the loss and the kept rows' advantages "
                   "recomputed without them (data filtering)")

    def flags(self, inputs):
        return inputs.detected()

    def baseline(self, cfg) -> str:
        return "kept"

    def split_gradients(self, per_row, flags):
        return _split_by_flags(per_row, flags, keep_flagged=False)


class FilterRandom(_RandomFlags, Filter):
    name = "filter_random"
    colour = "#ffbb78"
    role = "control"
    control = None
    ceiling = None
    matches = "filter"
    description = "filter with random flags at filter's per-step flag rate (filter's control)"


class FilterOracle(_LabelFlags, Filter):
    name = "filter_oracle"
    colour = "#a35200"
    role = "ceiling"
    control = "filter_oracle_random"
    ceiling = None
    description = ("ceiling: filter with the true hack label as the flags (a perfect detector); "
                   "never a treatment")


class FilterOracleRandom(_RandomFlags, Filter):
    name = "filter_oracle_random"
    colour = "#f2c38f"
    role = "control"
    control = None
    ceiling = None
    matches = "filter_oracle"
    description = "filter with random flags at filter_oracle's per-step flag rate (the ceiling's control)"


class OracleReward(Arm):
    name = "oracle_reward"
    colour = "#2ca02c"
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
    colour = None  # not Erase's: figures draw it in their fallback colour
    role = "ceiling"
    control = "random_v"
    vhack = "planted"
    description = ("erase along the planted hack direction u (toy.plant): the ceiling of erase in "
                   "the planted world (control random_v)")


ARMS: dict[str, type[Arm]] = {cls.name: cls for cls in (
    Vanilla, Erase, RandomV, Subtract, SubtractRandom, Route, RouteRandom, Filter, FilterRandom,
    OracleReward, RouteOracle, RouteOracleRandom, FilterOracle, FilterOracleRandom, ErasePlanted)}


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

    vanilla must be present (every arm is judged against it), every treatment's and ceiling's
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
    for a in arms:
        c = ARMS[a].control
        if c and c not in arms:
            missing.append(f"{c} (the matched control of {a})")
        m = ARMS[a].matches
        if m and m not in arms:
            missing.append(f"{m} ({a} flags at its per-step rate)")
    if positive_control and positive_control not in arms:
        missing.append(f"{positive_control} (compare.positive_control)")
    if missing:
        raise ValueError("pilot.arms is missing " + "; ".join(missing))
