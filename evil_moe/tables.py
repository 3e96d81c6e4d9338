"""Every TSV column the pipeline writes, with unit and meaning — the one place they are defined.

The column tables of docs/outputs.md are generated from this module (``python -m evil_moe.tables``) and a
test checks they agree. Writers use :func:`write_tsv` (atomic: a partial file never looks
complete) and :func:`append_tsv_row` (one row per step, header first).

Rates are fractions in [0, 1]; cosines are unitless ratios; ``seconds`` are wall-clock seconds.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from evil_moe.rl.arms import ARMS
from evil_moe.env.loopholes import MODES


@dataclass(frozen=True)
class Column:
    """One TSV column: ``name`` (snake_case), ``unit`` and ``meaning``."""

    name: str
    unit: str
    meaning: str


def _cols(rows: Sequence[tuple[str, str, str]]) -> tuple[Column, ...]:
    return tuple(Column(*r) for r in rows)


# results/pilots/{arm}/s{seed}/steps.tsv — one row per optimiser step.
STEPS = _cols([
    ("step", "int", "optimiser step, 0-based"),
    ("arm", "str", f"arm (evil_moe.rl.arms: {', '.join(ARMS)})"),
    ("seed", "int", "run seed (paired across arms)"),
    ("reward_mean", "reward", "mean reward of the step's student rollouts (the arm's reward: the oracle's for oracle_reward)"),
    ("hack_rate", "fraction", "rollouts the foolable grader passed and the oracle failed (exploited)"),
    *[(f"hack_rate_{m}", "fraction", f"hack rate among rollouts of {m} problems (empty if none this step)") for m in MODES],
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
    ("flag_rate", "fraction", "rows with gradient that the arm flagged (route, filter and their controls; empty otherwise)"),
    ("flag_precision", "fraction", "flagged rows that were hacks (logged only; empty when nothing was flagged)"),
    ("flag_recall", "fraction", "hack rows (with gradient) that were flagged (logged only; empty without hacks)"),
    ("kl", "nats/token", "mean K3 estimate of KL(policy || reference) over completion tokens (beta > 0 only)"),
    ("frac_clipped", "fraction", "completion tokens where the PPO clip is active"),
    ("ratio_p05", "ratio", "5th percentile of the per-token importance ratio"),
    ("ratio_p50", "ratio", "median importance ratio"),
    ("ratio_p95", "ratio", "95th percentile importance ratio"),
    ("sampler_gap_p95", "nats", "95th percentile over student completion tokens of |log pi_train - log pi_sampler| (sampler = the processed distribution generate drew from; ~0 when they agree)"),
    ("sampler_gap_max", "nats", "largest such gap"),
    ("delta_s_norm", "L2", "norm of all delta_s after the step"),
    ("delta_s_hack_norm", "L2", "norm of all delta_s_hack after the step (subtract and route grow it)"),
    ("tokens", "tokens", "completion tokens in the step"),
    ("seconds", "s", "wall-clock seconds of the step"),
    ("seconds_sample", "s", "of which: sampling the step's rollouts (HF generate with the adapter merged; "
     "with pilot.sampler vllm the weight push, the engine's sampling and our behaviour log-prob forward)"),
    ("seconds_grade", "s", "of which: grading them in the sandbox"),
    ("seconds_loss", "s", "of which: the loss's forward and backward (per-sample gradients included)"),
    ("seconds_arm", "s", "of which: the arm's hooks (detector, flags, routing, projection; kept-row rebaselining)"),
    ("seconds_optimiser", "s", "of which: gradient clip, optimiser step and the arm's update hook"),
    ("seconds_eval", "s", "held-out evaluation run after this step (every view), else empty; not part of seconds"),
])

# results/pilots/{arm}/s{seed}/eval.tsv — held-out evaluation after the last step (and every
# eval_every steps); one row per (step, view, mode) plus mode "all".
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
    ("role", "str", "reference | treatment | control | positive_control | ceiling (evil_moe.rl.arms)"),
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
    ("update_span_frac", "fraction", "mean over steps and seeds of the update's energy share in span(v_hack)"),
    ("frac_clipped_max", "fraction", "largest clip fraction of any step"),
    ("status", "str", "ok | invalid | missing (over the arm's seeds)"),
    ("isolation", "str", "the grader's isolation in the arm's pilots: bwrap (the sandbox) or rlimit-only (explicitly chosen; gt_correct is then not tamper-proof)"),
    ("flag_rate", "fraction", "mean over steps and seeds of the share of rows with gradient the arm flagged (flagging arms; a random-flag control follows its arm's per-step rate)"),
    ("flag_precision", "fraction", "mean over steps and seeds of the flags' precision against the true hack label"),
    ("flag_recall", "fraction", "mean over steps and seeds of the flags' recall against the true hack label"),
    ("drop_vs_vanilla", "fraction", "held-out hack-rate drop of this (arm, view) vs vanilla's trained view (paired, the gate's effect and interval; empty for vanilla)"),
    ("drop_ci_low", "fraction", "lower end of its interval"),
    ("drop_ci_high", "fraction", "upper end of its interval"),
    ("drop_vs_control", "fraction", "held-out hack-rate drop vs the arm's matched control in the same view (treatments and ceilings)"),
    ("control_ci_low", "fraction", "lower end of its interval"),
    ("control_ci_high", "fraction", "upper end of its interval"),
    ("ceiling", "str", "the treatment's ceiling arm (route: route_oracle, filter: filter_oracle; a perfect detector), on the judged view's row"),
    ("ceiling_drop", "fraction", "the ceiling's hack-rate drop vs vanilla in the same view"),
    ("ceiling_share", "fraction", "drop_vs_vanilla / ceiling_drop: the share of what a perfect detector achieves (empty when the ceiling's drop is not above 0)"),
    ("ceiling_share_ci_low", "fraction", "lower end of its interval (crossed bootstrap of seeds and problems, t-widened; evil_moe/gate/ceilings.py)"),
    ("ceiling_share_ci_high", "fraction", "upper end of that interval"),
    ("hack_rate_known", "fraction", "held-out hack rate on problems of the modes the detector knows (vhack.known_modes), same weighting as hack_rate"),
    ("hack_known_ci_low", "fraction", "lower end of its interval"),
    ("hack_known_ci_high", "fraction", "upper end of its interval"),
    ("hack_rate_unknown", "fraction", "held-out hack rate on problems of the modes the detector never saw (empty when it knows every mode): absorption"),
    ("hack_unknown_ci_low", "fraction", "lower end of its interval"),
    ("hack_unknown_ci_high", "fraction", "upper end of its interval"),
    *[(f"hack_rate_{m}", "fraction", f"held-out hack rate on {m} problems") for m in MODES],
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
# switch module, how much of the planted direction u it recovers (evil_moe.rl.vhack.plant_recovery).
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

# results/planted/checks.tsv — the planted world's checks (evil_moe.stages.extract.planted_checks).
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
    """Column names in order."""
    return [c.name for c in columns]


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
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    w.writerow(names(columns))
    for row in rows:
        _check_row(columns, row)
        w.writerow([_fmt(row.get(c.name)) for c in columns])
    return buf.getvalue()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder + ``os.replace``.

    A reader (or Snakemake) never sees a half-written file; parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are shared on clusters
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_tsv(path: str | Path, columns: Sequence[Column], rows: Iterable[Mapping]) -> None:
    """Atomically write a whole TSV (header + rows). Raises KeyError on an undefined column."""
    atomic_write_bytes(path, format_rows(columns, rows).encode())


def write_json(path: str | Path, obj) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def read_tsv(path: str | Path, required: Sequence[str]):
    """Read a TSV into a pandas DataFrame and check it has the ``required`` columns.

    Raises:
        ValueError: a required column is missing (names the file and the column).
    """
    import pandas as pd

    df = pd.read_csv(path, sep="\t", keep_default_na=True)
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column {missing[0]!r} (has: {', '.join(map(str, df.columns))})")
    return df


def read_tsv_rows(path: str | Path) -> list[dict[str, str]]:
    """Read a TSV written by :func:`write_tsv` as a list of ``{column: text}`` dicts, every value
    left as its text (no type guessing: problem ids such as ``"3249"`` stay strings; empty cells
    are ``""``). For tables that are checked or compared field by field; :func:`read_tsv` gives a
    DataFrame.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def write_jsonl_gz(path: str | Path, records: Iterable[Mapping]) -> None:
    """Atomically write records as gzip-compressed JSON lines (mtime 0, so output is reproducible)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        for rec in records:
            gz.write((json.dumps(rec) + "\n").encode())
    atomic_write_bytes(path, buf.getvalue())


def read_jsonl(path: str | Path) -> list[dict]:
    """Read a JSON-lines file, gzip or plain (by the ``.gz`` suffix).

    Raises:
        FileNotFoundError: naming the path.
        ValueError: a line that is not JSON, naming the path and the line number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return out


def markdown(columns: Sequence[Column]) -> str:
    """A markdown table of the columns (for docs/outputs.md)."""
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
