"""The collapse rule (evil_moe/rl/trainer/collapse.py) on steps.tsv rows: the embedded default's vanilla
s0 at pilot.lr 100, 1 and 0.3 (measured, docs/logs/results.md 2026-12-07: parse rate and entropy
per step), and rows made by hand; where it fires, the step and the cause it names, and what it
never reads as a collapse."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from evil_moe.config import load_config
from evil_moe.rl.trainer.collapse import check_collapse, collapsed
from evil_moe.rl.trainer.step import PilotInvalid

PC = load_config().pilot  # the schema's defaults (collapse_*), group 6 x 4 prompts: 24 rollouts a step

# Measured (vanilla s0 of the embedded default, 20 steps): step 0 is the student before any
# update, the same in every run.
STEP0 = (0.791667, 0.213077)
LR100 = [STEP0] + list(zip([0.0] * 19, [0.054185, 0.037284, 0.018454, 0.025513, 0.014322, 0.022121,
                                         0.013994, 0.01525, 0.01879, 0.006306, 0.016737, 0.009832,
                                         0.015425, 0.013552, 0.019556, 0.011971, 0.00491, 0.009051,
                                         0.005853]))
LR1 = [STEP0] + [(0.0, e) for e in (3.21114, 4.91187, 4.69287, 4.36937, 4.08349)]
LR03 = [STEP0, (0.208333, 0.56146), (0.041667, 1.13899), (0.0, 0.835181), (0.0, 1.76739), (0.0, 2.08271),
        (0.0, 2.56593)]


def rows(pairs, **cols):
    """steps.tsv rows from (parse_rate, entropy) pairs, finite losses and norms."""
    out = []
    for i, (parse, ent) in enumerate(pairs):
        r = {"step": i, "parse_rate": parse, "entropy": ent, "loss": 0.001, "grad_norm": 0.003,
             "delta_s_norm": 1.0 + i, "delta_s_hack_norm": 0.0}
        r.update({k: v[i] for k, v in cols.items()})
        out.append(r)
    return out


def pc(**kw):
    keys = ("collapse_steps", "collapse_parse_p", "collapse_entropy_rise", "group", "prompts_per_step",
            "mix_ratio")
    return SimpleNamespace(**({k: getattr(PC, k) for k in keys} | kw))


def test_the_measured_collapses_stop_where_the_defaults_say():
    """lr 100 and lr 1 write no code from step 1 on: stopped at step 3 (72 rollouts without code
    at step 0's 0.792 has probability 0.208**72, 8.9e-50); lr 0.3 loses it at step 3: stopped at
    step 5."""
    assert collapsed(rows(LR100), PC) == (
        "collapsed at step 3: no rollout's code parses at steps 1-3 (72 rollouts), though 0.792 of step 0's "
        "did: at that rate so long a run has probability 8.9e-50, below pilot.collapse_parse_p 1e-06")
    assert collapsed(rows(LR1), PC).startswith("collapsed at step 3: no rollout's code parses at steps 1-3")
    assert collapsed(rows(LR03), PC).startswith("collapsed at step 5: no rollout's code parses at steps 3-5")
    assert math.isclose(0.208333 ** 72, 8.9e-50, rel_tol=0.01)


def test_noise_stops_a_run_a_sharpening_policy_never_does():
    """lr 1's entropy (15x step 0's and more) stops the run where three steps in a row sit above
    4x: steps 1-3, even where some code still parses. A falling entropy never does: the positive
    control oracle_reward s0 (measured) sharpens to 0.26 of its step 0's entropy while its parse
    rate rises to 0.96, and lr 100's noise falls as low with code still parsing."""
    assert collapsed(rows([(0.5, e) for _, e in LR1]), PC) == (
        "collapsed at step 3: the sampling entropy blew up to 3.211 nats/token at least at steps 1-3, above "
        "step 0's 0.213 x pilot.collapse_entropy_rise 4")
    assert collapsed(rows([(0.5, e) for _, e in LR1]), pc(collapse_entropy_rise=None)) is None  # off
    oracle = [(0.79, 0.213), (0.62, 0.195), (0.79, 0.179), (0.75, 0.155), (0.71, 0.17), (0.67, 0.202),
              (0.83, 0.12), (0.88, 0.103), (0.88, 0.089), (0.83, 0.142), (0.83, 0.131), (0.88, 0.099),
              (0.96, 0.07), (0.88, 0.115), (0.96, 0.058), (0.96, 0.056), (0.96, 0.069), (0.96, 0.063),
              (0.88, 0.087), (0.92, 0.055)]
    assert collapsed(rows(oracle), PC) is None
    assert collapsed(rows([(0.5, e) for _, e in LR100]), PC) is None
    # below 4x (the healthy pilots stay under 2.3x over any 3 steps), or 4x for two steps only
    assert collapsed(rows([STEP0] + [(0.5, 0.85)] * 5), PC) is None
    assert collapsed(rows([STEP0, (0.5, 0.9), (0.5, 0.9), (0.5, 0.2), (0.5, 0.9), (0.5, 0.9)]), PC) is None


def test_a_model_that_seldom_writes_code_is_not_collapsed():
    """The tests' half-trained toy (p0 0-0.17 over 6 rollouts a step) writes no code for steps
    on end: at its own rate that is likely, not a collapse; nor is a run that never wrote code
    (step 0 without it: what broke is the set-up, not the training)."""
    small = pc(group=3, prompts_per_step=2)
    assert collapsed(rows([(0.17, 0.9)] + [(0.0, 0.9)] * 6), small) is None  # 0.83**18 = 0.035
    assert collapsed(rows([(0.0, 0.9)] * 7), PC) is None
    # three zero steps after code, one step of code in between starts the count again
    assert collapsed(rows([STEP0, (0.0, 0.2), (0.0, 0.2), (0.04, 0.2), (0.0, 0.2), (0.0, 0.2)]), PC) is None
    assert collapsed(rows([STEP0, (0.0, 0.2), (0.0, 0.2), (0.0, 0.2)]), pc(collapse_parse_p=None)) is None


def test_a_norm_or_loss_that_is_not_finite_is_a_collapse_at_once():
    for col in ("grad_norm", "delta_s_norm", "loss", "delta_s_hack_norm"):
        for bad in (math.nan, math.inf, "inf"):
            r = rows([STEP0] * 3)
            r[1][col] = bad
            assert collapsed(r, PC) == f"collapsed at step 1: {col} is {float(bad)} (not finite)"
    # an empty cell (a missing value in steps.tsv) and a missing column are not judged
    r = rows([STEP0] * 4)
    r[1]["grad_norm"] = ""
    del r[0]["loss"], r[2]["entropy"]
    assert collapsed(r, PC) is None


def test_check_collapse_stops_the_run():
    with pytest.raises(PilotInvalid, match=r"^collapsed at step 3: no rollout's code parses"):
        check_collapse(rows(LR100[:4]), PC)
    check_collapse(rows(LR100[:3]), PC)  # two steps without code are not three
