"""Stage ``reevaluate``: the held-out evaluation of finished pilots again, with more samples.

A finished pilot (``pilots/{arm}/s{seed}/``: ``adapter.safetensors``, ``steps.tsv``,
``outcomes.tsv``, ``status.json``) is judged by ``pilot.heldout_samples`` completions per
held-out problem and view. To test whether a result survives more sampling, this stage loads the
pilot's final adapter (``δS`` and ``δS_hack``) into the same student and runs the pilot's own
held-out evaluation (:func:`evil_moe.rl.trainer.evaluation.evaluate`, with its views
:meth:`~evil_moe.rl.arms.base.Arm.eval_views` / :func:`~evil_moe.rl.trainer.evaluation._view`) once more: the same
held-out problems, every view the arm evaluates, ``samples`` completions per problem and view,
and sampling seeds disjoint from the pilot's own.

Sampling seeds. The pilot samples the chunk of held-out problems starting at index ``c0`` with
seed ``7_000_003·s + 999_983 + c0`` (run seed ``s``, ``0 ≤ c0 < H`` for ``H`` held-out
problems). A re-evaluation adds ``seed_offset`` to it. With ``H ≤ seed_offset ≤ 7_000_003 − H``
(the default :data:`SEED_OFFSET` = 3,500,001 holds for any ``H ≤ 3,500,001``) no re-evaluation seed
equals the held-out seed of any pilot, whatever its run seed (two seeds coincide only if
``seed_offset + c0 − c0'`` is a multiple of 7,000,003), and none equals a training seed
(``1_000_003·s + step``) of a pilot with fewer than 499,972 steps. ``seed_offset = 0`` with
``samples = pilot.heldout_samples`` repeats the pilot's own evaluation (the test of this stage:
the same ``outcomes.tsv``, byte for byte, when the thread count is the pilot's). Only the final
adapter is kept, so only the final evaluation (``step = pilot.steps − 1``) is repeated, never
the ``pilot.eval_every`` ones.

Outputs, in ``out_dir`` (a mirror of the pilot folder that :func:`evil_moe.stages.compare.run_compare`
judges unchanged): ``outcomes.tsv`` (:data:`evil_moe.tables.OUTCOMES`, one row per completion,
the pilot's seed and final step), ``eval.tsv`` (:data:`evil_moe.tables.EVAL`), ``steps.tsv``
(the pilot's, copied: the training did not change) and ``status.json`` (the pilot's, plus a
``reevaluate`` record: source folder, samples, seed offset, torch threads, the grader's
isolation), written last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from evil_moe import files, tables
from evil_moe.rl.arms.registry import get_arm
from evil_moe.config import Config
from evil_moe.stages.common import (load_policy, load_problem_file, make_grader, require_sampler,
                                    train_heldout)
from evil_moe.files import require_file
from evil_moe.pilots import finished_pilot
from evil_moe.rl.trainer.evaluation import HELDOUT_SEED_STRIDE as _EVAL_SEED_STRIDE
from evil_moe.rl.trainer.evaluation import evaluate
from evil_moe.rl.vhack.direction import VHack

# The default seed offset (module docstring: disjoint from every pilot's held-out and training
# seeds for up to 3,500,001 held-out problems).
SEED_OFFSET = 3_500_001


def _evaluate(policy, heldout, step: int, init_ds, seed_offset: int) -> tuple[list[dict], list[dict]]:
    """:func:`evil_moe.rl.trainer.evaluation.evaluate` with a progress bar in the job's log."""
    from evil_moe.progress import bar
    from evil_moe.rl.trainer.evaluation import evaluation_total

    with bar(evaluation_total(policy, heldout), "reevaluate: held-out evaluation", "completion") as b:
        return evaluate(policy, heldout, step, init_ds, seed_offset=seed_offset, progress=b.update)


@dataclass
class _EvalPolicy:
    """What :func:`evil_moe.rl.trainer.evaluation.evaluate` and ``_view`` read of a trainer: the loaded
    policy with the pilot's final knobs, the grader, and the pilot's arm, seed and config."""

    pc: object
    tok: object
    arm: object
    model: object
    adapter: object
    seed: int
    grader: object
    ds: list
    vhack: VHack | None
    engine: object = None
    template_kwargs: dict = field(default_factory=dict)


def check_seed_offset(seed_offset: int, n_heldout: int) -> None:
    """Refuse a ``seed_offset`` whose seeds may meet a pilot's held-out seeds.

    0 (the pilot's own seeds, to reproduce its evaluation) is allowed; otherwise ``seed_offset``
    modulo 7,000,003 must lie in ``[n_heldout, 7_000_003 − n_heldout]`` (module docstring).

    Raises:
        ValueError: the offset is negative or falls outside that range (names both).
    """
    if seed_offset == 0:
        return
    r = seed_offset % _EVAL_SEED_STRIDE
    if seed_offset < 0 or not n_heldout <= r <= _EVAL_SEED_STRIDE - n_heldout:
        raise ValueError(f"seed_offset {seed_offset}: its seeds may equal a pilot's held-out seeds "
                         f"(need 0, or offset mod {_EVAL_SEED_STRIDE} in [{n_heldout}, "
                         f"{_EVAL_SEED_STRIDE - n_heldout}] for {n_heldout} held-out problems)")


def reevaluate_pilot(cfg: Config, *, pilot_dir: str, problems_path: str, model_path: str,
                     out_dir: str, samples: int, seed_offset: int = SEED_OFFSET,
                     vhack_path: str | None = None, init_adapter: str | None = None) -> dict:
    """Re-run one finished pilot's held-out evaluation with ``samples`` completions per problem.

    Args:
        cfg: the pilot's run config (sections ``pilot``, ``problems``, ``grader``, ``models``,
            ``adapter``): the held-out split, sampling (``max_new``, ``temperature``, ``top_p``,
            ``eval_chunk``), views and grader are the pilot's only if the config is. Its
            ``pilot.heldout_samples`` is replaced by ``samples``.
        pilot_dir: the finished pilot ``.../{arm}/s{seed}`` (its ``status.json`` says ``ok``).
        problems_path: the pilot's ``problems.jsonl``.
        model_path: the pilot's student model (folder or hub id).
        out_dir: the mirror folder (module docstring); created.
        samples: completions per held-out problem and view (≥ 1).
        seed_offset: added to the pilot's held-out sampling seed (module docstring; 0 = the
            pilot's own seeds).
        vhack_path: ``v_hack`` of the run; needed only by the ``projected`` view (vanilla with
            ``pilot.static_projection``).
        init_adapter: the pilot's initial adapter (``pilot.init: distill``); the ``projected``
            view measures the update from it.

    Returns:
        the mirror's ``status.json`` dict (the pilot's, with ``reevaluate``: ``source``,
        ``samples``, ``seed_offset``, ``torch_threads``, the grader's ``isolation``,
        ``n_outcomes``).

    Raises:
        FileNotFoundError: the pilot folder, its ``status.json``, ``adapter.safetensors``,
            ``steps.tsv`` or ``outcomes.tsv``, the problems file or ``vhack_path`` is missing
            (names the path).
        ValueError: the pilot did not finish (``status`` not ``ok``); its ``steps.tsv`` is
            empty; its adapter names another arm or seed than its ``steps.tsv``; the config's
            views, held-out problems or final step are not those of the pilot's
            ``outcomes.tsv`` (another config); the
            ``projected`` view without ``vhack_path`` or with ``pilot.vhack_refresh_every`` (the
            refreshed v_hack is not kept); ``samples < 1``; a ``seed_offset`` refused by
            :func:`check_seed_offset`.
    """
    src = Path(pilot_dir)
    paths, status, arm, seed = _finished_pilot(src, samples)
    cfg, arm_obj, views, step, problems, heldout = _pilot_design(cfg, samples, arm, problems_path,
                                                                 seed_offset)
    _check_same_design(paths["outcomes"], status, views, step, {p.id for p in heldout})
    if "projected" in views:
        if not vhack_path:
            raise ValueError(f"arm {arm} evaluates the projected view: give the run's v_hack")
        if cfg.pilot.vhack_refresh_every:
            raise ValueError("the projected view reads the pilot's last refreshed v_hack "
                             "(pilot.vhack_refresh_every), which a finished pilot does not keep")
    pc = cfg.pilot
    adapter_path, steps_path = paths["adapter"], paths["steps"]

    require_sampler(cfg)  # before the model is loaded for nothing
    model, tok, adapter, device = load_policy(model_path, cfg, init_adapter=init_adapter)
    init_ds = [p.detach().clone() for p in adapter.delta_s_params()]
    adapter.load(adapter_path)
    vhack = VHack.load(require_file(vhack_path, "v_hack")).to(device) if vhack_path else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files.remove(out / "status.json")  # complete only when it says so
    with make_grader(problems, cfg) as grader:
        policy = _EvalPolicy(pc=pc, tok=tok, arm=arm_obj, model=model, adapter=adapter, seed=seed,
                             grader=grader, ds=adapter.delta_s_params(), vhack=vhack,
                             template_kwargs=dict(cfg.models.chat_template_kwargs))
        if pc.sampler == "vllm":
            from evil_moe.rl.policy.vllm_sampler import VLLMSampler

            policy.engine = VLLMSampler.from_config(model_path, cfg, adapter)
        evals, outcomes = _evaluate(policy, heldout, step, init_ds, seed_offset)
        isolation = grader.isolation
    tables.write_tsv(out / "eval.tsv", tables.EVAL, evals)
    tables.write_tsv(out / "outcomes.tsv", tables.OUTCOMES, outcomes)
    files.atomic_write_bytes(out / "steps.tsv", steps_path.read_bytes())  # the pilot's, checked above
    new = {**status, "reevaluate": {"source": str(src), "samples": int(samples),
                                    "seed_offset": int(seed_offset),
                                    "torch_threads": torch.get_num_threads(),
                                    "isolation": isolation, "n_outcomes": len(outcomes)}}
    files.write_json(out / "status.json", new)
    return new


def _finished_pilot(src: Path, samples: int) -> tuple[dict, dict, str, int]:
    """The finished pilot's files (``status``, ``adapter``, ``steps``, ``outcomes`` paths), its
    status dict, arm and seed (:func:`evil_moe.pilots.finished_pilot`), its adapter checked to be
    that arm's and seed's; raises as :func:`reevaluate_pilot` documents."""
    from evil_moe.model.adapter import SVDAdapter

    paths, status, arm, seed = finished_pilot(src)
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    meta = SVDAdapter.read_metadata(paths["adapter"]).get("extra") or {}
    if (meta.get("arm"), meta.get("seed")) not in ((None, None), (arm, seed)):
        raise ValueError(f"{paths['adapter']}: adapter of {meta.get('arm')} s{meta.get('seed')}, "
                         f"its steps.tsv says {arm} s{seed}")
    return paths, status, arm, seed


def _pilot_design(cfg: Config, samples: int, arm: str, problems_path: str, seed_offset: int):
    """``(cfg, arm_obj, views, step, problems, heldout)``: the config with ``samples`` per
    held-out problem, the arm, its views, the final step, the problems and the held-out ones;
    the seed offset checked (:func:`check_seed_offset`)."""
    from evil_moe.config import validate

    raw = cfg.to_dict()
    raw["pilot"]["heldout_samples"] = int(samples)
    cfg = Config(validate(raw))
    arm_obj = get_arm(arm, pass_reward=cfg.grader.pass_reward)
    problems = load_problem_file(problems_path)
    _, heldout = train_heldout(problems, cfg)
    check_seed_offset(seed_offset, len(heldout))
    return cfg, arm_obj, arm_obj.eval_views(cfg.pilot), cfg.pilot.steps - 1, problems, heldout


def _check_same_design(outcomes_path: Path, status: dict, views, step: int, heldout_ids: set) -> None:
    """The config gives the pilot's design: its final step, views and held-out problems."""
    rows = [r for r in files.read_tsv_rows(outcomes_path) if int(r["step"]) == step]
    if not rows:
        raise ValueError(f"{outcomes_path}: no outcomes at step {step} (pilot.steps of the config "
                         f"is not the pilot's)")
    have_views = sorted({r["view"] for r in rows})
    if have_views != sorted(views) or (status.get("views") and sorted(status["views"]) != sorted(views)):
        raise ValueError(f"{outcomes_path}: the pilot evaluated views {have_views}, the config gives "
                         f"{sorted(views)}")
    ids = {r["problem_id"] for r in rows}
    if ids != heldout_ids:
        raise ValueError(f"{outcomes_path}: the pilot's held-out problems differ from the config's "
                         f"split ({len(ids)} vs {len(heldout_ids)}; e.g. "
                         f"{sorted(ids ^ heldout_ids)[:3]})")


def reevaluate_tree(cfg: Config, *, pilots_dir: str, out_dir: str, arms, seeds, samples: int,
                    problems_path: str, model_path: str, seed_offset: int = SEED_OFFSET,
                    vhack_path: str | None = None, init_adapter: str | None = None,
                    skip_done: bool = True, log=print) -> list[dict]:
    """:func:`reevaluate_pilot` for every ``arms × seeds`` pilot under ``pilots_dir`` into the
    mirror ``out_dir/{arm}/s{seed}``, one after the other (one policy load each).

    ``skip_done``: a mirror folder whose ``status.json`` already records the same ``samples`` and
    ``seed_offset`` is kept (a rerun after an interruption continues). ``log`` gets one line per
    pilot (seconds taken).

    Returns:
        the status dicts, in order.

    Raises:
        as :func:`reevaluate_pilot`, for the first pilot that fails.
    """
    import time

    done = []
    for arm in arms:
        for seed in seeds:
            dst = Path(out_dir) / arm / f"s{seed}"
            st = dst / "status.json"
            if skip_done and st.is_file():
                kept = files.read_json(st, "re-evaluation status")
                old = kept.get("reevaluate") or {}
                if (old.get("samples"), old.get("seed_offset")) == (samples, seed_offset):
                    log(f"{arm} s{seed}: done before, kept")
                    done.append(kept)
                    continue
            t = time.perf_counter()
            done.append(reevaluate_pilot(cfg, pilot_dir=str(Path(pilots_dir) / arm / f"s{seed}"),
                                         problems_path=problems_path, model_path=model_path,
                                         out_dir=str(dst), samples=samples, seed_offset=seed_offset,
                                         vhack_path=vhack_path, init_adapter=init_adapter))
            log(f"{arm} s{seed}: {done[-1]['reevaluate']['n_outcomes']} outcomes in "
                f"{time.perf_counter() - t:.1f}s -> {dst}")
    return done


__all__ = ["SEED_OFFSET", "check_seed_offset", "reevaluate_pilot", "reevaluate_tree"]
