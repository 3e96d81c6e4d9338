"""The arm interface (:mod:`evil_moe.rl.arms.registry` is the registry and the list of arms): the base
class :class:`Arm` with its declarations and hooks, what the trainer hands a flagging arm
(:class:`FlagInputs`), the random-flag controls' matched rate (:class:`FlagRateMatch`), the
advantages over the kept rows (:func:`kept_advantages`) and the gradients after routing
(:class:`SplitGrads`, :func:`split_by_flags`). The hooks and the roles are described in
:mod:`evil_moe.rl.arms.registry` and docs/arms.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: the config check reads the registry
    import torch  # and must not pay torch's import (~1.5 s per `snakemake -n`)

    from evil_moe.rl.vhack.projection import ProjectionStats

ROLES = ("reference", "treatment", "control", "positive_control", "ceiling")


@dataclass
class FlagInputs:
    """What a flagging arm sees for the step's rows with gradient (``B`` rows).

    Attributes:
        scores: ``(B,)`` fp64 per-sample scores of the run's detector
            (:meth:`evil_moe.rl.detectors.registry.Detector.score`: e.g. the gradient detector's
            hack-ward score, the probe's logit) when the arm flags with it; None otherwise, or
            when the detector has no score.
        pattern: ``(B,)`` bool, the pattern detector's verdict (always scored) — the
            environment's recognition of the known modes' loophole use, never the oracle.
        threshold: the thresholded detector's threshold (``pilot.detector_calibration``).
        detector: a name of :data:`evil_moe.rl.detectors.registry.DETECTORS` (``pilot.detector``).
        budget: under ``pilot.detector_calibration: budget``, the share of the step's rows to
            flag (the highest scores; the threshold is then not used); None otherwise.
        rng: the step's generator (seeded by seed and step; used by the random-flag controls
            and the noisy-label detector).
        label: ``(B,)`` bool, the true hack label (``grade.exploited``) — given only to arms
            that declare :attr:`Arm.reads_label` (the ceilings) and to a detector that needs it
            (``noisy_label``); None otherwise, so no treatment under a deployable detector
            can read it.
        precision, recall: the ``noisy_label`` detector's quality (``pilot.detector_precision``,
            ``pilot.detector_recall``).
        accuracy: the ``noisy_label`` detector's accuracy (``pilot.detector_accuracy``: each
            row's true label flipped with probability ``1 − accuracy``); None = precision and
            recall.
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
    accuracy: float | None = None
    target_count: int | None = None
    budget: float | None = None

    def detected(self) -> torch.Tensor:
        """``(B,)`` bool: the configured detector's flags (:meth:`evil_moe.rl.detectors.registry.Detector.flag`:
        scores above the threshold, or the ``ceil(budget·B)`` highest scores under a budget, ties
        broken by row order; the pattern detector's verdicts; the noisy label).

        Raises:
            ValueError: a thresholded detector without scores; the noisy-label detector without
                the label; an unknown detector.
        """
        from evil_moe.rl.detectors.registry import get_detector

        return get_detector(self.detector).flag(self)


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
    def read(path, column: str = "flag_rate") -> list[float | None]:
        """The per-step ``column`` of a pilot's ``steps.tsv`` (None where empty): ``flag_rate``
        (rate-matched controls) or ``hack_expert_share`` (dose-matched controls, :class:`DoseMatch`).

        Raises:
            FileNotFoundError: no such file (names it). ValueError: no such column.
        """
        from evil_moe.files import read_tsv_rows, require_file

        rows = read_tsv_rows(require_file(path, "matched arm's steps file"))
        if rows and column not in rows[0]:
            raise ValueError(f"{path}: no {column} column")
        rows.sort(key=lambda r: int(r["step"]))
        return [float(r[column]) if r[column] not in ("", None) else None for r in rows]


class DoseMatch(FlagRateMatch):
    """The per-step dose a dose-matched control deletes, so that its share of gradient energy
    sent to ``δS_hack`` follows its matched arm's per step and their per-seed means agree.

    The dose of a step is its ``hack_expert_share`` (:func:`hack_expert_share`): the share of the
    split gradient's energy routed to the deleted expert. The targets are the matched arm's
    per-step shares ``t_s`` (its per-seed mean where it had no rows); the control splits every
    rollout's gradient alike (:func:`uniform_split`) at a share it achieves exactly, so a balance
    builds up only at steps where the control itself has no rows, and is paid back spread over
    the steps left, as :class:`FlagRateMatch` does for counts.
    """

    def share(self, step: int, has_rows: bool) -> float:
        """The share to delete at ``step`` in [0, 1]; updates the balance (call once per step)."""
        t = self.target(step)
        if not has_rows:
            self.balance += t - self.mean
            return 0.0
        left = max(len(self.rates) - step, 1)
        s = min(max(t + self.balance / left, 0.0), 1.0)
        self.balance += t - s
        return s


def kept_advantages(rewards, kept, scale_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """Group advantages recomputed over the kept rows only (true data filtering).

    ``A'_{pg} = R_{pg} − mean_{h ∈ kept(p)} R_{ph}`` for a kept row (``/ (std_kept + eps)`` with
    ``scale_std``, the unbiased std over the kept rows, 0 when fewer than two); 0 for a row that is
    not kept, and 0 in a group whose kept rows all have the same reward (Dr.GRPO,
    arXiv:2503.20783, applied to the data a filter leaves).

    Args:
        rewards: ``(P, G)`` rewards.
        kept: ``(P, G)`` bool (True = the row stays in the loss).
        scale_std, eps: as :func:`evil_moe.rl.policy.grpo.group_advantages`.

    Returns:
        ``(P, G)`` advantages, the dtype of :func:`evil_moe.rl.policy.grpo.group_advantages`.

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


def sum_rows(per_row: Sequence[Sequence[torch.Tensor]], rows) -> list[torch.Tensor] | None:
    """Per-module sum of the per-sample gradients of ``rows`` (``per_row``: ``B`` lists of
    per-module ``(r,)`` tensors); None when there are no samples at all."""
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


def hack_expert_share(delta_s, delta_s_hack) -> float | None:
    """The dose of a split: ``‖g_δS_hack‖² / (‖g_δS‖² + ‖g_δS_hack‖²)``, the share of the split
    gradient's energy routed to the deleted expert (with :class:`evil_moe.rl.optim.SplitAdamW`'s
    one second moment over both knobs, also the share of the step's update energy it gets, up to
    momentum). None without a δS_hack gradient; 0 for an all-zero split."""
    if delta_s_hack is None:
        return None
    e_h, e_d = _energy(delta_s_hack), _energy(delta_s)
    return e_h / (e_h + e_d) if e_h + e_d > 0 else 0.0


def uniform_split(total, share: float) -> SplitGrads:
    """Every rollout's gradient split alike, ``ω`` of it to δS_hack and ``1 − ω`` to δS, with
    ``ω = √s / (√s + √(1 − s))`` so that the split's dose (:func:`hack_expert_share`)
    ``ω² / (ω² + (1 − ω)²)`` equals ``share`` = s exactly: non-selective deletion at a given
    dose (the dose-matched controls). ``total``: per-module ``(r,)`` summed gradients."""
    import math

    s = min(max(float(share), 0.0), 1.0)
    w = math.sqrt(s) / (math.sqrt(s) + math.sqrt(1.0 - s)) if s > 0 else 0.0
    return SplitGrads([(1.0 - w) * g for g in total], [w * g for g in total], _energy([w * g for g in total]) / max(_energy(total), 1e-300))


def split_by_flags(per_row, flags, *, keep_flagged: bool, unflagged_both: bool = False) -> SplitGrads:
    """Unflagged rows' sum → δS; flagged rows' sum → δS_hack (``keep_flagged``, route) or
    dropped (filter); with ``unflagged_both`` the unflagged rows' sum trains δS_hack as well
    (Cloud et al. 2024, arXiv:2410.04332 §4.3: unlabelled data updates every parameter, only
    labelled data is masked). ``removed_frac`` = the flagged sum's energy over the whole sum's."""
    rows = range(len(per_row))
    flagged = sum_rows(per_row, [i for i in rows if bool(flags[i])])
    unflagged = sum_rows(per_row, [i for i in rows if not bool(flags[i])])
    total = _energy(sum_rows(per_row, rows))
    hack = flagged if keep_flagged else None
    if keep_flagged and unflagged_both and flagged is not None:
        hack = [f + u for f, u in zip(flagged, unflagged)]
    return SplitGrads(unflagged, hack, _energy(flagged) / total if total > 0 else 0.0)


class Arm:
    """Base arm: Dr.GRPO on the environment's reward (``grader.reward_rule``), measuring only (see :class:`Vanilla`).

    Class attributes (the arm's declaration, read by the trainer, the workflow and the gate):
        name: registry key (also the results folder name).
        role: ``reference`` | ``treatment`` | ``control`` | ``positive_control`` | ``ceiling``
            (a treatment with a perfect ingredient: never a treatment, never read by one).
        control: the matched control arm of a treatment or a ceiling (same view), else None.
        ceiling: the ceiling arm a treatment is set beside in the report (route: route_oracle),
            else None.
        dose_ceiling: the ceiling at the treatment's own dose (route: route_oracle_dose, the true
            label flagged at route's per-step count), else None.
        matches: for a random-flag control, the arm whose per-step flag rates it matches
            (:class:`FlagRateMatch`); for a dose-matched control, the arm whose per-step dose it
            matches (:class:`DoseMatch`); else None.
        match_by: ``count`` (the matched arm's flag rate) or ``dose`` (its ``hack_expert_share``).
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
        splits_gradient: the arm divides the step's gradient between ``δS`` and ``δS_hack``
            (routing); the trainer then uses :class:`evil_moe.rl.policy.optim.SplitAdamW` (one AdamW
            over the summed knob, its update split), so a knob moves only by what is routed to it.
        trains: the arm trains at all (False: the untrained reference, evaluated as it starts).
        router: Evil MoE's soft router (:mod:`evil_moe.rl.detectors.router`) decides per rollout how much of
            its gradient trains ``δS_hack``: ``authored`` (seeded with ``v_act`` from the authored
            pairs and pinned on their labels), ``random`` (its matched control: a random seed
            direction, the pairs' labels shuffled), or None (no router).
        shortcut: Advantage Modification (:mod:`evil_moe.rl.arms.by_advantage`) discounts each
            rollout's reward by its shortcut score before the group baseline, the score read along
            ``authored`` (the authored pairs' mean difference at a middle layer) or ``random`` (its
            matched control: a random unit direction at the same layer); None (no discount).
        needs_sample_grads: the trainer must compute per-sample gradients (flagging arms).
        penalises: the arm flags every rollout of the step before its advantages are formed
            and trains on the flagged rollouts' reward less a penalty (:meth:`penalised`; a
            reward intervention: the monitor penalty, :mod:`evil_moe.rl.arms.by_reward`).
        sections: config sections the arm reads beyond the pilot's (``penalty``,
            ``inoculation``): they are part of its run's checkpoint key.
        description: one line for the README, the report and ``evil-moe pilot --help``.
        colour: the arm's colour in every figure (matplotlib ``#rrggbb``; distinct across arms),
            or None for the figure's fallback colour.
        uses_labels: labelled data the arm reads that :meth:`label_sources` cannot derive from
            the above (names of :data:`evil_moe.rl.detectors.registry.LABEL_SOURCES`; oracle_reward:
            ``oracle_pass``). A new arm that reads no new kind of label declares nothing.
    """

    name: ClassVar[str] = ""
    role: ClassVar[str] = "reference"
    control: ClassVar[str | None] = None
    ceiling: ClassVar[str | None] = None
    dose_ceiling: ClassVar[str | None] = None
    matches: ClassVar[str | None] = None
    match_by: ClassVar[str] = "count"
    reads_label: ClassVar[bool] = False
    views: ClassVar[tuple[str, ...]] = ("trained",)
    projected_view: ClassVar[bool] = False
    static_twin: ClassVar[tuple[str, str] | None] = None
    vhack: ClassVar[str] = "real"
    trains_delta_s_hack: ClassVar[bool] = False
    splits_gradient: ClassVar[bool] = False
    trains: ClassVar[bool] = True
    router: ClassVar[str | None] = None
    shortcut: ClassVar[str | None] = None
    needs_sample_grads: ClassVar[bool] = False
    penalises: ClassVar[bool] = False
    sections: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    colour: ClassVar[str | None] = None
    uses_labels: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def label_sources(cls, pc) -> tuple[str, ...]:
        """The labelled data the arm's training reads (names of
        :data:`evil_moe.rl.detectors.registry.LABEL_SOURCES`, each once; empty: none), under the
        pilot section ``pc`` (``detector``, ``detector_calibration``): :attr:`uses_labels`; the
        true label of its rollouts when it :attr:`reads_label` (the ceilings); what its detector's
        flags rest on when it :meth:`flags_with_detector`
        (:meth:`~evil_moe.rl.detectors.registry.Detector.label_sources`); v_hack's pairs when it
        acts along the real v_hack (an :meth:`on_gradients` or :meth:`on_update` hook with
        ``vhack = "real"``); the authored pairs when its router is pinned on their labels. A
        random-flag or dose-matched control reads none: its count or dose is its matched arm's."""
        from evil_moe.rl.detectors.registry import DETECTORS

        out = list(cls.uses_labels) + (["rollouts"] if cls.reads_label else [])
        if cls.flags_with_detector():
            out += DETECTORS[pc.detector].label_sources(pc.detector_calibration)
        if cls.vhack == "real" and (cls.on_gradients is not Arm.on_gradients or cls.on_update is not Arm.on_update):
            out.append("vhack")
        if cls.router == "authored":
            out.append("authored")
        return tuple(dict.fromkeys(out))

    @classmethod
    def flags_with_detector(cls) -> bool:
        """The arm's flags come from the run's detector (``pilot.detector``): it flags samples and
        is neither a ceiling (its flags are the label) nor a random-flag control (it follows its
        matched arm's rate)."""
        return bool(cls.flags_rollouts() and not cls.reads_label and not cls.matches)

    @classmethod
    def flags_rollouts(cls) -> bool:
        """The arm flags rollouts at each step (route, filter and their kin among the rows with
        gradient; the penalty arms among every rollout, before the advantages): its ``steps.tsv``
        logs the flags' rate, precision and recall."""
        return bool(cls.needs_sample_grads or cls.penalises)

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

    def instruction(self, problem, cfg) -> str:
        """Text appended to the user message of ``problem``'s training prompt (``cfg``: the run
        config); ``""`` = the plain prompt. Only the trainer's training prompts read it; the
        held-out evaluation builds its prompts without it (inoculation prompting,
        :mod:`evil_moe.rl.arms.by_reward`)."""
        return ""

    def flags(self, inputs: FlagInputs) -> torch.Tensor | None:
        """``(B,)`` bool per-sample flags, or None (the arm does not flag)."""
        return None

    def penalised(self, rewards, inputs: FlagInputs, penalty) -> tuple[torch.Tensor, torch.Tensor]:
        """A penalising arm's (:attr:`penalises`) ``(B,)`` training rewards of the step's
        ``(B,)`` rollout ``rewards`` and each rollout's penalty weight in [0, 1] (``penalty``: the
        config's ``penalty`` section). Only the penalty arms implement it."""
        raise NotImplementedError(f"arm {self.name} does not penalise")

    def baseline(self, cfg) -> str:
        """Which rows' rewards the group baseline of the step's advantages is taken over, once
        the flags are known: ``group`` (every row of the group: the advantages computed before
        flagging) or ``kept`` (the unflagged rows only, :func:`kept_advantages`; flagged rows
        keep the whole group's advantage). ``cfg`` is the pilot section."""
        return "group"

    def split_gradients(self, per_row: Sequence[Sequence[torch.Tensor]], flags, cfg=None,
                        dose: float | None = None) -> SplitGrads:
        """Sum per-sample gradients into the δS (and δS_hack) gradients.

        Args:
            per_row: ``B`` lists of per-module ``(r,)`` gradients (each sample's share of the
                Dr.GRPO loss, so they sum to the batch gradient).
            flags: ``(B,)`` bool or None.
            cfg: the pilot section (route reads ``route_unflagged``); None = the defaults.
            dose: a dose-matched control's share to delete this step (:class:`DoseMatch`);
                None for every other arm.
        """
        return SplitGrads(sum_rows(per_row, range(len(per_row))), None)

    def on_gradients(self, adapter, v, optimizer, cfg) -> ProjectionStats | None:
        """Act on ``δS.grad`` (summed) before the optimiser step; returns projection stats."""
        return None

    def on_update(self, adapter, v, before: list[torch.Tensor], cfg) -> ProjectionStats | None:
        """Act on the optimiser's update (``δS`` after the step vs ``before``)."""
        return None
