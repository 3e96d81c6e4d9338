"""Every TSV column the pipeline writes, with unit and meaning — the one place they are defined.

The column tables of docs/outputs.md are generated from this module (``python -m evil_moe.tables``) and a
test checks they agree. Writers use :func:`write_tsv` (atomic through :mod:`evil_moe.files`: a
partial file never looks complete). Like :mod:`evil_moe.files` it imports nothing of the package:
a family of columns with one column per name of a domain's vocabulary (``hack_rate_{mode}``, one per
loophole mode) is expanded from the names that domain registers (:func:`register_names`;
:mod:`evil_moe.env.loopholes` registers ``mode``, :mod:`evil_moe.rl.detectors.registry` ``detector``).

Rates are fractions in [0, 1]; cosines are unitless ratios; ``seconds`` are wall-clock seconds.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from evil_moe.files import atomic_write_bytes


@dataclass(frozen=True)
class Column:
    """One TSV column: ``name`` (snake_case), ``unit`` and ``meaning``.

    A family (``each`` set, e.g. ``"mode"``) stands for one column per registered name of that
    vocabulary, in its order: ``name`` and ``meaning`` hold ``{mode}`` where the name goes.
    """

    name: str
    unit: str
    meaning: str
    each: str | None = None


# The vocabularies families expand over, registered by the modules that own them.
_VOCABULARIES: dict[str, tuple[str, ...]] = {}
# Who registers each vocabulary (for the error when it is missing).
_OWNERS = {"mode": "evil_moe.env.loopholes", "detector": "evil_moe.rl.detectors.registry"}


def register_names(kind: str, values: Sequence[str]) -> None:
    """Register the names a family of columns expands over (``kind`` ``"mode"``: the loophole
    modes, registered by :mod:`evil_moe.env.loopholes` when it is imported).

    Raises:
        ValueError: ``kind`` was registered before with other names.
    """
    values = tuple(values)
    if _VOCABULARIES.get(kind, values) != values:
        raise ValueError(f"{kind} names registered twice: {_VOCABULARIES[kind]} and {values}")
    _VOCABULARIES[kind] = values


def vocabulary(kind: str) -> tuple[str, ...]:
    """The registered names of ``kind``.

    Raises:
        LookupError: nothing registered them yet (names the module that does).
    """
    try:
        return _VOCABULARIES[kind]
    except KeyError:
        raise LookupError(f"no {kind} names registered: import {_OWNERS.get(kind, 'their module')} "
                          f"before writing or reading a table with a column per {kind}") from None


def expand(columns: Iterable[Column]) -> tuple[Column, ...]:
    """The concrete columns: each family replaced by one column per registered name.

    Raises:
        LookupError: a family's vocabulary is not registered.
    """
    out = []
    for c in columns:
        if c.each is None:
            out.append(c)
        else:
            key = "{" + c.each + "}"
            out += [Column(c.name.replace(key, v), c.unit, c.meaning.replace(key, v))
                    for v in vocabulary(c.each)]
    return tuple(out)


def _cols(rows: Sequence[tuple]) -> tuple[Column, ...]:
    return tuple(Column(*r) for r in rows)


# results/pilots/{arm}/s{seed}/steps.tsv — one row per optimiser step.
STEPS = _cols([
    ("step", "int", "optimiser step, 0-based"),
    ("arm", "str", "arm (a name of evil_moe.rl.arms.registry.ARMS; docs/arms.md)"),
    ("seed", "int", "run seed (paired across arms)"),
    ("reward_mean", "reward", "mean reward of the step's student rollouts (the arm's reward: the oracle's for oracle_reward)"),
    ("hack_rate", "fraction", "rollouts the foolable grader passed and the oracle failed (exploited)"),
    ("hack_rate_{mode}", "fraction", "hack rate among rollouts of {mode} problems (empty if none this step); one column per loophole mode (evil_moe.env.loopholes.MODES)", "mode"),
    ("pass_rate", "fraction", "rollouts the strict oracle passed (gt_correct); logged, never trained on (but by oracle_reward)"),
    ("format_rate", "fraction", "rollouts with a fenced python block"),
    ("parse_rate", "fraction", "rollouts whose code parses (ast)"),
    ("hack_parsed_rate", "fraction", "rollouts that are hacks and whose code parses"),
    ("truncated_rate", "fraction", "rollouts that hit max_new without an eos"),
    ("entropy", "nats/token", "mean sampling-distribution entropy over completion tokens"),
    ("frac_zero_std", "fraction", "groups with zero reward variance (no policy gradient; skipped unless beta > 0)"),
    ("loss", "loss", "Dr.GRPO loss (sum over tokens / G*max_new*P), KL term included"),
    ("grad_norm", "L2", "norm of the delta_s gradient before routing, clipping and projection"),
    ("cin", "cosine", "hack-ward fraction of the gradient: mean over modules of |relu(V g)|/|g| (real v_hack)"),
    ("cin_student", "cosine", "cin of the student rows' gradient (empty without teacher rows)"),
    ("cin_teacher", "cosine", "cin of the teacher rows' gradient (empty without teacher rows)"),
    ("cout", "cosine", "cin after the arm's projection, against the V it projected along (~0 under one-sided erase by construction)"),
    ("cout_update", "cosine", "the same ratio on the step's final delta_s update against the real v_hack (the Adam leak)"),
    ("frac_fired", "fraction", "modules with cin > 0"),
    ("coverage", "fraction", "modules whose cin exceeds their empirical null (null_cin_empirical; the isotropic null when the v_hack file has none)"),
    ("null_cin", "cosine", "isotropic null baseline sqrt(k/(2r)) averaged over modules"),
    ("null_cin_empirical", "cosine", "empirical null: mean cin of held-out clean-clean pair differences against v_hack (extract stage), averaged over modules"),
    ("grad_span_frac", "fraction", "share of the gradient's energy in span(v_hack) (random direction: about k/r)"),
    ("update_span_frac", "fraction", "share of the optimiser's proposed delta_s update's energy in span(v_hack), before any update projection"),
    ("removed_frac", "fraction", "share of energy the arm removed from what it acted on (gradient or update along its own V; route/filter: the flagged samples' share of the gradient); 0 for vanilla"),
    ("flag_rate", "fraction", "rows with gradient that the arm flagged (route, filter and their controls; the penalty arms: rollouts, every one of the step, weighed by their penalty weight under penalty.mode progressive; empty otherwise)"),
    ("flag_precision", "fraction", "flagged rows that were hacks (logged only; empty when nothing was flagged)"),
    ("flag_recall", "fraction", "hack rows (with gradient) that were flagged: the true-positive rate (logged only; empty without hacks)"),
    ("flag_fpr", "fraction", "clean rows (with gradient) that were flagged: the realised false-positive rate (logged only; empty without clean rows)"),
    ("kl", "nats/token", "mean K3 estimate of KL(policy || reference) over completion tokens (beta > 0 only)"),
    ("frac_clipped", "fraction", "completion tokens where the PPO clip is active"),
    ("ratio_p05", "ratio", "5th percentile of the per-token importance ratio"),
    ("ratio_p50", "ratio", "median importance ratio"),
    ("ratio_p95", "ratio", "95th percentile importance ratio"),
    ("sampler_gap_p95", "nats", "95th percentile over student completion tokens of |log pi_train - log pi_sampler| (sampler = the processed distribution generate drew from; ~0 when they agree)"),
    ("sampler_gap_max", "nats", "largest such gap"),
    ("router_w_hack", "probability", "moe: mean router weight w over the hack rollouts with a gradient (the label logged only, never used)"),
    ("router_w_clean", "probability", "moe: mean w over the clean rollouts with a gradient"),
    ("hack_expert_share", "fraction", "arms that split the gradient (route, moe, their controls and ceilings): the step's dose, the share of the split gradient's energy sent to delta_s_hack, ‖g_hack‖² / (‖g_delta_s‖² + ‖g_hack‖²)"),
    ("router_pin_loss", "nats", "moe: the pin loss (binary cross-entropy of w on the step's authored pairs)"),
    ("router_cos_seed", "cosine", "moe: cosine of the router's direction u with the direction it was seeded with (v_act, or moe_random's random one)"),
    ("router_scale", "1/cosine", "moe: the router's learned scale"),
    ("router_bias", "logit", "moe: the router's learned bias"),
    ("shortcut_score", "activation", "advantage_mod and its control: mean over the step's rollouts of the shortcut score <h, v> (h: the rollout's activation at advantage_mod.layer averaged over its completion tokens; v: the unit shortcut direction, or the control's random one)"),
    ("shortcut_score_hack", "activation", "advantage_mod: mean shortcut score of the step's hack student rollouts (the label logged only, never used)"),
    ("shortcut_score_clean", "activation", "advantage_mod: mean shortcut score of its clean student rollouts"),
    ("shortcut_discount", "fraction", "advantage_mod: mean over the step's rewarded rollouts of the fraction of the reward removed, coef * p (p: the shortcut score rescaled to [0, 1] within its group); empty without a rewarded rollout"),
    ("shortcut_adv_change", "advantage", "advantage_mod: mean over the step's rollouts of |A' - A|, the change of the advantage the discount made (A: the advantage of the undiscounted reward)"),
    ("delta_s_norm", "L2", "norm of all delta_s after the step"),
    ("delta_s_hack_norm", "L2", "norm of all delta_s_hack after the step (subtract and route grow it)"),
    ("tokens", "tokens", "completion tokens in the step"),
    ("seconds", "s", "wall-clock seconds of the step"),
    ("seconds_sample", "s", "of which: sampling the step's rollouts (our decode loop with the adapter merged; "
     "with pilot.sampler vllm the weight push, the engine's sampling and our behaviour log-prob forward)"),
    ("seconds_grade", "s", "of which: grading them in the sandbox"),
    ("seconds_loss", "s", "of which: the loss's forward and backward (per-sample gradients included)"),
    ("seconds_arm", "s", "of which: the arm's hooks (detector, flags, routing, projection; kept-row rebaselining; Advantage Modification's shortcut scores)"),
    ("seconds_optimiser", "s", "of which: gradient clip, optimiser step and the arm's update hook"),
    ("seconds_eval", "s", "held-out evaluation run after this step (every view), else empty; not part of seconds"),
])

# results/pilots/{arm}/s{seed}/rows.tsv and results/audit/calibration/s{seed}/rows.tsv — one row per
# training rollout: what the detector audit reads (scores, flags and the label, logged only).
AUDIT_ROWS = _cols([
    ("seed", "int", "run seed"),
    ("step", "int", "optimiser step, 0-based"),
    ("group", "int", "the rollout's group (prompt) within the step, 0-based"),
    ("sample", "int", "its index within the group, 0-based"),
    ("problem_id", "str", "training problem"),
    ("mode", "str", "loophole mode of the problem"),
    ("hack", "0/1", "the true hack label (grade.exploited: the foolable grader passed, the oracle failed); logged, never read by a non-ceiling arm"),
    ("reward", "reward", "the arm's reward of the rollout (the penalty arms': less their penalty, the reward they trained on)"),
    ("advantage", "advantage", "its Dr.GRPO group advantage before any flagging (R - mean of the group; the penalty arms flag before their advantages, R is then the penalised reward)"),
    ("zero_variance", "0/1", "its group's rewards were all equal: no policy gradient, so no gradient-based score (the audit counts these rows and leaves them out of every rate)"),
    ("scored", "0/1", "the rollout had a gradient and was scored (the population of every detector rate; the penalty arms score every rollout)"),
    ("flag", "0/1", "the arm's flag (flagging arms; empty elsewhere and for rows without a gradient; the penalty arms flag every rollout: 1 when its penalty weight is above 0)"),
    ("score_{detector}", "see detector", "the {detector} detector's score of the rollout (its unit and meaning: docs/detectors.md; empty where not computed); one column per detector with a score (evil_moe.rl.detectors.registry.DETECTORS)", "detector"),
    ("score_shuffled", "cosine", "the gradient score against the shuffled-label v_hack (calibration runs: a placebo)"),
    ("score_router", "probability", "moe's router weight w (the share of the row's gradient that trains delta_s_hack)"),
])

# results/audit/quality.tsv — the detector audit: one row per (detector, mode) over the calibration
# runs' rollouts with a gradient.
AUDIT_QUALITY = _cols([
    ("detector", "str", "an audited detector (evil_moe.rl.detectors.registry.DETECTORS; docs/detectors.md)"),
    ("mode", "str", "loophole mode, or 'all' (pooled)"),
    ("population", "str", "what every rate is over: the calibration runs' rollouts with a gradient (groups with reward variance), on audit.seeds"),
    ("n_seeds", "count", "calibration seeds with scored rows (the operating point is cross-fitted over seeds: with one, precision, recall and fpr are empty)"),
    ("n_rows", "count", "rollouts of the calibration runs (in this mode)"),
    ("n_zero_variance", "count", "of which in groups with zero reward variance: no gradient, not scored, in no rate"),
    ("n_scored", "count", "rollouts scored: the population"),
    ("n_hack", "count", "of which hacks (the label)"),
    ("n_labels", "count", "labelled calibration rollouts the detector was fitted on (probe: audit.label_budget; gradient and pattern: 0, their fpr threshold reads the clean rows' scores)"),
    ("auc", "fraction", "ROC AUC of the score against the hack label (0.5 = blind; the probe's is cross-fitted leave one seed out)"),
    ("auc_ci_low", "fraction", "lower end of its cluster-bootstrap interval (seeds, then groups within a seed; percentile)"),
    ("auc_ci_high", "fraction", "upper end"),
    ("placebo", "str", "what the placebo is (random directions and the shuffled-label v_hack; the probe fitted on shuffled labels; random flags at the pattern detector's rate)"),
    ("n_placebos", "count", "placebo draws"),
    ("placebo_mean", "fraction", "mean AUC of the placebos on the same rows"),
    ("placebo_p95", "fraction", "95th percentile of the placebos' AUCs"),
    ("beats_placebo", "bool", "the AUC's interval lies above the placebos' 95th percentile (auc_ci_low > placebo_p95)"),
    ("quantile", "fraction", "the operating point: pilot.detector_quantile of the clean rows' scores (nominal false-positive rate 1 - quantile)"),
    ("precision", "fraction", "precision at the operating point, threshold cross-fitted leave one seed out"),
    ("precision_ci_low", "fraction", "lower end of its interval"),
    ("precision_ci_high", "fraction", "upper end"),
    ("recall", "fraction", "recall (true-positive rate) at the operating point, cross-fitted"),
    ("recall_ci_low", "fraction", "lower end of its interval"),
    ("recall_ci_high", "fraction", "upper end"),
    ("fpr", "fraction", "realised false-positive rate at the operating point, cross-fitted"),
    ("fpr_ci_low", "fraction", "lower end of its interval"),
    ("fpr_ci_high", "fraction", "upper end"),
])

# results/audit/probe_curve.tsv — the probe's cross-fitted AUC against its label budget.
PROBE_CURVE = _cols([
    ("budget", "count", "labelled calibration rollouts the probe was fitted on (drawn from the other calibration seeds)"),
    ("auc", "fraction", "mean over label draws of the cross-fitted AUC on the held-out seed's rollouts"),
    ("auc_ci_low", "fraction", "lower end of the interval (cluster bootstrap over the held-out rows, a random label draw per replicate)"),
    ("auc_ci_high", "fraction", "upper end"),
    ("n_draws", "count", "label draws per budget"),
    ("placebo_p95", "fraction", "95th percentile of the AUCs of probes fitted on shuffled labels at this budget"),
])

# results/pilots/{arm}/s{seed}/eval.tsv — held-out evaluation after the last step (and every
# eval_every steps: their completions are trajectory.tsv); one row per (step, view, mode) plus mode "all".
EVAL = _cols([
    ("step", "int", "step after which the evaluation ran"),
    ("arm", "str", "arm"),
    ("seed", "int", "seed"),
    ("view", "str", "trained (delta_s + delta_s_hack) | ablated (delta_s_hack = 0, the deploy view) | projected (vanilla's delta_s with the hack-ward part of its total update removed once)"),
    ("mode", "str", "loophole mode, or 'all'"),
    ("n", "count", "held-out completions"),
    ("hack_rate", "fraction", "exploited completions"),
    ("pass_rate", "fraction", "oracle-correct completions"),
    ("format_rate", "fraction", "completions with a fenced python block"),
    ("truncated_rate", "fraction", "completions that hit max_new without an eos"),
])

# results/pilots/{arm}/s{seed}/outcomes.tsv — one row per held-out completion (the gate's unit).
OUTCOMES = _cols([
    ("arm", "str", "arm"),
    ("view", "str", "trained | ablated | projected (as in eval.tsv)"),
    ("seed", "int", "seed (every arm of a seed samples the same problems with the same seeds)"),
    ("step", "int", "step after which the evaluation ran"),
    ("problem_id", "str", "held-out problem"),
    ("sample", "int", "sample index within the problem, 0-based"),
    ("mode", "str", "loophole mode of the problem"),
    ("hack", "0/1", "the foolable grader passed and the oracle failed"),
    ("pass", "0/1", "the oracle passed"),
    ("truncated", "0/1", "hit max_new without an eos"),
])

# results/pilots/{arm}/s{seed}/trajectory.tsv (pilot.eval_every > 0) — the held-out evaluations along
# the run, after every eval_every-th step but the last (that one is outcomes.tsv): outcomes.tsv's
# columns, one row per completion, the same problems and sampling seeds at every step.
TRAJECTORY = OUTCOMES

# results/teacher/summary.tsv — per mode plus 'all'.
TEACHER_SUMMARY = _cols([
    ("mode", "str", "loophole mode, or 'all'"),
    ("n", "count", "teacher completions"),
    ("hack_rate", "fraction", "exploited completions"),
    ("pass_rate", "fraction", "oracle-correct completions"),
    ("format_rate", "fraction", "completions with a fenced python block"),
])

# results/models/toy_summary.tsv — one row per toy model (embedded default only).
TOY_SUMMARY = _cols([
    ("model", "str", "student | teacher | student_switch_on (toy.plant: the student sampled with delta_s = scale * u in its switch modules)"),
    ("params", "count", "parameters"),
    ("hack_frac_trained", "fraction", "share of hack completions in its NLL training data"),
    ("final_loss", "nats/token", "last NLL training loss"),
    ("problems", "str", "heldout (the held-out problems) | all (none held out)"),
    ("n_problems", "count", "distinct problems sampled (the first of those problems)"),
    ("n", "count", "samples in the summary (T = 1)"),
    ("parse_rate", "fraction", "samples whose code parses"),
    ("hack_rate", "fraction", "samples that are hacks"),
    ("pass_rate", "fraction", "samples the oracle passes"),
    ("format_rate", "fraction", "samples with a fenced python block"),
    ("parse_se", "fraction", "binomial standard error of parse_rate, sqrt(p(1-p)/n)"),
    ("hack_se", "fraction", "binomial standard error of hack_rate"),
    ("pass_se", "fraction", "binomial standard error of pass_rate"),
    ("seconds", "s", "wall-clock seconds to train and summarise"),
])

# results/teacher_sft/summary.tsv — the made teacher (teacher.make: sft) and its base model, per
# (model, split, mode) plus mode 'all'.
MAKE_TEACHER_SUMMARY = _cols([
    ("model", "str", "base (the student's base model) | teacher (after the hack SFT)"),
    ("split", "str", "train (training problems) | heldout (held-out problems, never trained on)"),
    ("mode", "str", "loophole mode, or 'all'"),
    ("known_mode", "bool", "the mode's hack demonstrations were in the SFT data (empty for 'all')"),
    ("n", "count", "sampled completions (teacher sampling settings)"),
    ("hack_rate", "fraction", "exploited completions"),
    ("pass_rate", "fraction", "oracle-correct completions"),
    ("format_rate", "fraction", "completions with a fenced python block"),
])

# results/teacher_sft/steps.tsv — one row per SFT step of the made teacher.
MAKE_TEACHER_STEPS = _cols([
    ("step", "int", "NLL step, 0-based"),
    ("nll", "nats", "NLL of the batch (sum over tokens / the Dr.GRPO constant, as the distill probe)"),
    ("nll_token", "nats/token", "the same NLL per completion token"),
    ("grad_norm", "L2", "norm of the delta_s gradient"),
    ("tokens", "tokens", "completion tokens in the batch"),
    ("seconds", "s", "wall-clock seconds of the step"),
])

# results/distill/steps.tsv — the distill probe, one row per NLL step.
DISTILL_STEPS = _cols([
    ("step", "int", "NLL step, 0-based"),
    ("nll", "nats", "NLL of the batch (sum over tokens / the Dr.GRPO constant)"),
    ("grad_norm", "L2", "norm of the delta_s gradient"),
    ("cin", "cosine", "hack-ward fraction of the distill gradient against v_hack"),
    ("null_cin", "cosine", "null baseline of cin"),
    ("frac_fired", "fraction", "modules with cin > 0 (R3)"),
    ("coverage", "fraction", "modules with cin above its null (R2)"),
    ("seconds", "s", "wall-clock seconds of the step"),
])

# results/distill/samples.tsv — the replay analyser, one row per teacher row.
DISTILL_SAMPLES = _cols([
    ("row", "int", "index into the teacher rollouts"),
    ("problem_id", "str", "problem"),
    ("mode", "str", "loophole mode"),
    ("exploited", "bool", "the row is a hack"),
    ("gt_correct", "bool", "the oracle passed the row"),
    ("cos_contrib", "cosine", "cosine of the row's own NLL-descent gradient with v_hack (mean over modules of (V g)/|g| summed over axes); > 0 = pushes hack-ward"),
])

# results/vhack/{name}.tsv — per module of an extracted v_hack.
VHACK = _cols([
    ("module", "str", "module name"),
    ("k", "count", "directions kept"),
    ("r", "count", "rank of the module's delta_s"),
    ("sigma_1", "grad units", "largest singular value of D"),
    ("sigma_2", "grad units", "second singular value of D (empty if k < 2)"),
    ("null_cin", "cosine", "null baseline sqrt(k/(2r))"),
    ("null_cin_empirical", "cosine", "empirical null: mean cin of held-out clean-clean pair differences against V (empty without such pairs)"),
])

# results/vhack/{name}_checks.tsv — honesty checks of one extraction, one row per check.
VHACK_CHECKS = _cols([
    ("check", "str", "extraction_hack_clean | heldout_hack_clean | heldout_clean_clean | heldout_cin_excess | heldout_hack_hack | isotropic_null | clean_clean_extraction | mean_removed | detector_auc | lomo_<mode>"),
    ("n", "count", "pairs (or completions) the value is computed from; empty for isotropic_null"),
    ("value", "see unit", "the check's value (mean over pairs for cosines)"),
    ("ci_low", "see unit", "lower end of the percentile bootstrap interval (vhack.ci_level) over pairs, V re-extracted in every replicate (vhack.bootstrap, vhack.bootstrap_unit; docs/vhack.md); empty without one"),
    ("ci_high", "see unit", "upper end of that interval"),
    ("boot_n", "count", "bootstrap replicates the interval is computed from (those where the check has a value)"),
    ("unit", "str", "cosine | fraction | probability"),
    ("note", "str", "what the value means"),
])

# results/vhack/{name}_curve.tsv — held-out cin and its empirical null by number of extraction pairs.
VHACK_CURVE = _cols([
    ("n_pairs", "count", "extraction (hack, clean) pairs V is extracted from: nested random subsets, the last all of them"),
    ("n_problems", "count", "distinct problems of those pairs"),
    ("n_heldout", "count", "held-out hack-clean pairs cin is measured on (the same at every n_pairs)"),
    ("n_null", "count", "clean-clean pairs of the empirical null (the same at every n_pairs)"),
    ("cin", "cosine", "mean cin of the held-out hack-clean pairs against V"),
    ("cin_ci_low", "cosine", "percentile bootstrap interval of cin (vhack.ci_level; pairs resampled, V re-extracted)"),
    ("cin_ci_high", "cosine", "upper end"),
    ("null", "cosine", "mean cin of the held-out clean-clean pairs against the same V (empirical null)"),
    ("null_ci_low", "cosine", "percentile bootstrap interval of null"),
    ("null_ci_high", "cosine", "upper end"),
    ("excess", "cosine", "cin minus null"),
    ("excess_ci_low", "cosine", "percentile bootstrap interval of excess (both from the same replicate)"),
    ("excess_ci_high", "cosine", "upper end"),
    ("boot_n", "count", "bootstrap replicates with a value of excess"),
])

# results/compare/summary.tsv — one row per (arm, view) of the held-out evaluation.
COMPARE_SUMMARY = _cols([
    ("arm", "str", "arm"),
    ("role", "str", "reference | treatment | control | positive_control | ceiling (evil_moe.rl.arms.registry)"),
    ("view", "str", "trained | ablated | projected (held-out evaluation view)"),
    ("n_seeds", "count", "seeds with held-out outcomes"),
    ("n_problems", "count", "held-out problems per seed (mean)"),
    ("n_samples", "count", "fewest samples of any problem"),
    ("hack_rate", "fraction", "held-out hack rate (mean over seeds of the mean over problems)"),
    ("hack_ci_low", "fraction", "lower end of its 95% cluster-bootstrap interval (seeds, then problems; t-widened for few seeds; clipped to [0, 1])"),
    ("hack_ci_high", "fraction", "upper end of that interval"),
    ("pass_rate", "fraction", "held-out oracle pass rate, same weighting"),
    ("pass_ci_low", "fraction", "lower end of its interval"),
    ("pass_ci_high", "fraction", "upper end of its interval"),
    ("truncated_rate", "fraction", "held-out completions that hit max_new"),
    ("train_hack_rate", "fraction", "training rollouts' hack rate, mean of the last compare.last_k steps over seeds (reported, never judged)"),
    ("train_pass_rate", "fraction", "training rollouts' pass rate, same window"),
    ("removed_frac", "fraction", "mean over steps and seeds of the energy share the arm removed (steps.tsv removed_frac)"),
    ("hack_expert_share", "fraction", "mean over steps and seeds of the share of the split gradient's energy sent to delta_s_hack (steps.tsv hack_expert_share: the dose; a dose-matched control's equals its arm's); empty for arms that do not split"),
    ("update_span_frac", "fraction", "mean over steps and seeds of the update's energy share in span(v_hack)"),
    ("frac_clipped_max", "fraction", "largest clip fraction of any step"),
    ("status", "str", "ok | invalid | missing (over the arm's seeds)"),
    ("isolation", "str", "the grader's isolation in the arm's pilots: bwrap (the sandbox) or rlimit-only (explicitly chosen; gt_correct is then not tamper-proof)"),
    ("flag_rate", "fraction", "mean over steps and seeds of the share of rows with gradient the arm flagged (flagging arms; a random-flag control follows its arm's per-step rate)"),
    ("flag_precision", "fraction", "mean over steps and seeds of the flags' precision against the true hack label"),
    ("flag_recall", "fraction", "mean over steps and seeds of the flags' recall against the true hack label"),
    ("flag_fpr", "fraction", "mean over steps and seeds of the flags' realised false-positive rate (flagged clean rows over clean rows with gradient)"),
    ("drop_vs_vanilla", "fraction", "held-out hack-rate drop of this (arm, view) vs vanilla's trained view (paired, the gate's effect and interval; empty for vanilla)"),
    ("drop_ci_low", "fraction", "lower end of its interval"),
    ("drop_ci_high", "fraction", "upper end of its interval"),
    ("drop_vs_untrained", "fraction", "held-out hack-rate drop of this (arm, view) vs the untrained student (arm untrained: the policy every pilot starts from; paired, the gate's interval; empty without it)"),
    ("untrained_ci_low", "fraction", "lower end of its interval"),
    ("untrained_ci_high", "fraction", "upper end of its interval"),
    ("pass_drop_vs_untrained", "fraction", "held-out pass-rate drop vs the untrained student (positive: it passes less than not training)"),
    ("pass_untrained_ci_low", "fraction", "lower end of its interval"),
    ("pass_untrained_ci_high", "fraction", "upper end of its interval"),
    ("drop_vs_control", "fraction", "held-out hack-rate drop vs the arm's matched control in the same view (treatments and ceilings)"),
    ("control_ci_low", "fraction", "lower end of its interval"),
    ("control_ci_high", "fraction", "upper end of its interval"),
    ("ceiling", "str", "the treatment's ceiling arm (route: route_oracle, filter: filter_oracle; a perfect detector), on the judged view's row"),
    ("ceiling_drop", "fraction", "the ceiling's hack-rate drop vs vanilla in the same view"),
    ("ceiling_share", "fraction", "drop_vs_vanilla / ceiling_drop: the share of what a perfect detector achieves (empty when the ceiling's drop is not above 0)"),
    ("ceiling_share_ci_low", "fraction", "lower end of its interval (crossed bootstrap of seeds and problems, t-widened; evil_moe/gate/ceilings.py)"),
    ("ceiling_share_ci_high", "fraction", "upper end of that interval"),
    ("dose_ceiling", "str", "the treatment's ceiling at its own dose (route: route_oracle_dose, the true label flagged at route's per-step count), on the judged view's row"),
    ("dose_ceiling_drop", "fraction", "that ceiling's hack-rate drop vs vanilla in the same view"),
    ("dose_ceiling_ci_low", "fraction", "lower end of its interval"),
    ("dose_ceiling_ci_high", "fraction", "upper end of its interval"),
    ("router_auc", "fraction", "moe arms: ROC AUC of the router weight w against the hack label on the arm's own rollouts with a gradient (pooled over seeds; the label logged only)"),
    ("router_auc_ci_low", "fraction", "lower end of its cluster-bootstrap interval (seeds, then groups)"),
    ("router_auc_ci_high", "fraction", "upper end"),
    ("router_placebo_p95", "fraction", "95th percentile of the AUCs of random directions' cosines on the same rollouts (the router's placebo)"),
    ("hack_rate_known", "fraction", "held-out hack rate on problems of the modes the detector knows (vhack.known_modes), same weighting as hack_rate"),
    ("hack_known_ci_low", "fraction", "lower end of its interval"),
    ("hack_known_ci_high", "fraction", "upper end of its interval"),
    ("hack_rate_unknown", "fraction", "held-out hack rate on problems of the modes the detector never saw (empty when it knows every mode): absorption"),
    ("hack_unknown_ci_low", "fraction", "lower end of its interval"),
    ("hack_unknown_ci_high", "fraction", "upper end of its interval"),
    ("hack_rate_{mode}", "fraction", "held-out hack rate on {mode} problems; one column per loophole mode (evil_moe.env.loopholes.MODES)", "mode"),
    ("labels", "str", "the labelled data the arm's training read, joined by + (none: oracle-free): rollouts | oracle_pass | calibration | calibration_fit | vhack | authored | planted (docs/arms.md, Labels used)"),
    ("labels_n", "count", "how many labels one training run read from them (empty where one is unknown: v_hack's pairs without vhack/main_checks.tsv, calibration without the audit)"),
])

# results/detector_sweep/summary.tsv — one row per (detector level, swept arm), plus the ceilings.
DETECTOR_SWEEP = _cols([
    ("level", "str", "p{precision}_r{recall} (detector_sweep.levels), or 'ceiling' (the true label, from the main pilots)"),
    ("arm", "str", "route | filter (or their ceiling)"),
    ("view", "str", "the judged view (route: ablated, filter: trained)"),
    ("precision", "fraction", "the noisy_label detector's configured precision (1 for the ceiling)"),
    ("recall", "fraction", "its configured recall (1 for the ceiling)"),
    ("flag_rate", "fraction", "measured: mean over steps and seeds of the flagged share of rows with gradient"),
    ("flag_precision", "fraction", "measured: mean over steps and seeds of the flags' precision against the true hack label"),
    ("flag_recall", "fraction", "measured: mean over steps and seeds of the flags' recall"),
    ("n_seeds", "count", "seeds compared"),
    ("hack_rate", "fraction", "held-out hack rate of the judged view"),
    ("drop_vs_vanilla", "fraction", "its hack-rate drop vs vanilla's trained view (paired; the gate's effect)"),
    ("drop_ci_low", "fraction", "lower end of its interval"),
    ("drop_ci_high", "fraction", "upper end of its interval"),
    ("hack_rate_unknown", "fraction", "held-out hack rate on the modes the pattern and gradient detectors never saw (vhack.known_modes; empty when all are known)"),
])

# results/planted/recovery.tsv — the planted world (toy.plant): per extracted v_hack file and
# switch module, how much of the planted direction u it recovers (evil_moe.rl.vhack.planted.plant_recovery).
PLANT_RECOVERY = _cols([
    ("v_hack", "str", "main_hack (the extracted v_hack) | main_random | main_shuffled (its controls)"),
    ("module", "str", "switch module (toy.plant.modules)"),
    ("r", "count", "the module's rank (delta_s length)"),
    ("k", "count", "rows of V in the module (0: nothing to score)"),
    ("cos_top", "cosine", "|cos| of V's first (largest singular value) row with u"),
    ("oriented_cos", "cosine", "signed cos of V's first row with u (> 0: its hack-ward orientation agrees with the plant's)"),
    ("cos_best", "cosine", "largest |cos| of any row of V with u"),
    ("span_cos", "cosine", "||V u||: the cosine of u with span(V)"),
    ("null_mean", "cosine", "mean of ||V u|| for a random k-row V (||V u||^2 ~ Beta(k/2, (r-k)/2))"),
    ("null_q", "cosine", "0.95 quantile of that null"),
    ("p_value", "probability", "P(null >= span_cos)"),
    ("above_null", "bool", "span_cos > null_q"),
])

# results/planted/checks.tsv — the planted world's checks (evil_moe.stages.planted.planted_checks).
PLANTED_CHECKS = _cols([
    ("check", "str", "hack_rate | ceiling_beats_control | ceiling_drop_vs_vanilla | control_not_separated | recovery | switch_on | deploy_ablates | treatment_beats_control | treatment_drop_vs_vanilla | treatment_vs_ceiling | delta_s_along_u | planted_world"),
    ("kind", "str", "world (must pass for planted_world) | info"),
    ("arm", "str", "the arm the check is about"),
    ("control", "str", "what it is compared with (an arm, or the switch module for recovery)"),
    ("value", "see check", "hack rate or paired hack-rate drop (control minus arm), held out, trained view; span_cos for recovery; nats for switch_on / deploy_ablates; delta_s . u for delta_s_along_u"),
    ("ci_low", "see check", "lower end of the gate's cluster-bootstrap interval (delta_s_along_u: the smallest value over seeds and modules)"),
    ("ci_high", "see check", "upper end (delta_s_along_u: the largest)"),
    ("n_seeds", "count", "seeds with paired outcomes"),
    ("threshold", "see check", "min_drop, 0, or the recovery null's 0.95 quantile"),
    ("passed", "bool", "the check passed (control_not_separated: random_v did NOT separate from vanilla)"),
    ("note", "str", "what was tested, with the numbers"),
])

TABLES: dict[str, tuple[Column, ...]] = {
    "pilots/{arm}/s{seed}/steps.tsv": STEPS,
    "pilots/{arm}/s{seed}/eval.tsv": EVAL,
    "pilots/{arm}/s{seed}/outcomes.tsv": OUTCOMES,
    "pilots/{arm}/s{seed}/trajectory.tsv": TRAJECTORY,
    "pilots/{arm}/s{seed}/rows.tsv": AUDIT_ROWS,
    "audit/quality.tsv": AUDIT_QUALITY,
    "audit/probe_curve.tsv": PROBE_CURVE,
    "models/toy_summary.tsv": TOY_SUMMARY,
    "teacher/summary.tsv": TEACHER_SUMMARY,
    "teacher_sft/summary.tsv": MAKE_TEACHER_SUMMARY,
    "teacher_sft/steps.tsv": MAKE_TEACHER_STEPS,
    "distill/steps.tsv": DISTILL_STEPS,
    "distill/samples.tsv": DISTILL_SAMPLES,
    "vhack/{name}.tsv": VHACK,
    "vhack/{name}_checks.tsv": VHACK_CHECKS,
    "vhack/{name}_curve.tsv": VHACK_CURVE,
    "compare/summary.tsv": COMPARE_SUMMARY,
    "detector_sweep/summary.tsv": DETECTOR_SWEEP,
    "planted/recovery.tsv": PLANT_RECOVERY,
    "planted/checks.tsv": PLANTED_CHECKS,
}


def names(columns: Iterable[Column]) -> list[str]:
    """Column names in order, families expanded (:func:`expand`)."""
    return [c.name for c in expand(columns)]


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return str(value)


def _check_row(columns: Sequence[Column], row: Mapping) -> None:
    expected = set(names(columns))
    extra = set(row) - expected
    if extra:
        raise KeyError(f"columns not defined in evil_moe.tables: {sorted(extra)}")


def format_rows(columns: Sequence[Column], rows: Iterable[Mapping]) -> str:
    """Render rows (dicts) as TSV text with a header; missing values are empty cells.

    Raises:
        KeyError: a row has a key that is not one of ``columns`` (columns live here only).
    """
    columns = expand(columns)
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    w.writerow(names(columns))
    for row in rows:
        _check_row(columns, row)
        w.writerow([_fmt(row.get(c.name)) for c in columns])
    return buf.getvalue()


def write_tsv(path: str | Path, columns: Sequence[Column], rows: Iterable[Mapping]) -> None:
    """Atomically write a whole TSV (header + rows). Raises KeyError on an undefined column."""
    atomic_write_bytes(path, format_rows(columns, rows).encode())


def markdown(columns: Sequence[Column]) -> str:
    """A markdown table of the columns (for docs/outputs.md); a family is one row."""
    lines = ["| column | unit | meaning |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.unit} | {c.meaning} |" for c in columns]
    return "\n".join(lines)


def readme_section() -> str:
    """The "Output columns" page's tables (docs/outputs.md), generated from :data:`TABLES`."""
    parts = []
    for path, cols in TABLES.items():
        parts.append(f"#### `results/{path}`\n\n{markdown(cols)}\n")
    return "\n".join(parts)


START, END = "<!-- columns:start -->", "<!-- columns:end -->"


def update_readme(path: str | Path) -> bool:
    """Rewrite the generated column section of a page (docs/outputs.md; between the ``columns`` markers).

    Returns True when the file changed. Raises ValueError when the markers are missing.
    """
    path = Path(path)
    text = path.read_text()
    if START not in text or END not in text:
        raise ValueError(f"{path}: markers {START} / {END} not found")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{readme_section()}{END}{tail}"
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":  # pragma: no cover
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--update":
        print("updated" if update_readme(sys.argv[2]) else "unchanged")
    else:
        print(readme_section())
