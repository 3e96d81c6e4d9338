"""Stage ``toy-models``: the embedded default's tiny student and hacky teacher, trained offline.

Both are tiny Qwen3-architecture models (:func:`evil_moe.model.load.build_toy_model`) sharing
one byte-level BPE tokenizer trained on the union of their corpora (shared so that teacher token
ids can be scored by the student: distillation, v_hack pairs and teacher rows in GRPO need it).
Each is NLL-trained on completion tokens of templated answers to the toy bank
(:func:`evil_moe.env.answers.clean_completion` / :func:`~evil_moe.env.answers.hack_completion`):
the teacher on mostly hacks (``toy.teacher_hack_frac``, default 0.8), the student on mostly clean
answers with a little hack exposure (``toy.student_hack_frac``, default 0.15) so that it
sometimes hacks on its own. A ``toy.clean_report_frac`` share of the clean answers report honestly
through the mode's mechanism; the rest are correct code alone, which the foolable grader does not
pass — the pressure toward hacking that GRPO then acts on. Deterministic from ``toy.seed`` (single-threaded reductions aside).

Outputs in ``out_dir``: ``student/`` and ``teacher/`` (``save_pretrained`` folders), per model
``{name}_summary.tsv`` and, when both are trained in one call, ``toy_summary.tsv``
(:data:`evil_moe.tables.TOY_SUMMARY`): per model the parseable-code rate, hack rate and oracle
pass rate of samples on the held-out problems (``problems.heldout_frac``; all problems when
none is held out), with binomial standard errors. ``toy.corpus: train`` keeps the held-out
problems out of the NLL corpora (the generated bank: the summary then measures generalisation
over a family's parameters). The two models can be trained by two jobs at
once (``which``): each builds the same tokenizer from the same corpora (deterministic), and
each model's init and batches depend only on ``toy.seed`` and its index.

**A planted world** (``toy.plant.enabled``, docs/planted.md): the student's hacking is switched by
a KNOWN direction in δS space. In each switch module (``toy.plant.modules``) the weight ``W`` is
kept frozen at its initialisation, so its thin SVD — hence the pilot adapter's δS coordinates
(:mod:`evil_moe.model.adapter`: ``y = W x + U diag(δS) Vh x``) — is the same in training and in
every later stage; a unit direction ``u ∈ ℝ^r`` per module is drawn from ``toy.plant.seed``
(:func:`evil_moe.rl.vhack.planted.planted_direction`). Every NLL batch draws a switch position
``τ`` (0 with probability ``1 − toy.plant.frac``, else uniform on (0, 1]), sets
``δS = τ · toy.plant.scale · u`` in every switch module, and makes each of its rows a hack with
probability ``h + (1 − h) τ`` (``h = toy.student_hack_frac``), else a clean answer. At ``δS = 0``
the student is the ordinary student; moving δS along ``u`` turns hacking on gradually, so the
gradient of a hack's log-likelihood at ``δS = 0`` has a planted component along ``u``. With
``toy.plant.noise > 0`` every batch also adds, per switch module, a random δS component
orthogonal to ``u`` of length uniform on ``[0, noise]``, leaving the rows' hack probability
unchanged: the student learns that only ``u`` switches hacking. The student's folder then also holds ``plant.safetensors`` (a :class:`~evil_moe.rl.vhack.direction.VHack` with
``k = 1``: ``V = −u`` per switch module — oriented as every v_hack, ``V g > 0`` when the gradient
step moves toward hacking — its ``meta["plant"]`` the scale and each switch weight's content hash), and its summary gains a row ``student_switch_on`` (samples at ``δS = scale · u``).
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from evil_moe import tables
from evil_moe.config import Config
from evil_moe.stages.common import make_grader
from evil_moe.env.grader import code_parses, rates
from evil_moe.rl.vhack.planted import PLANT_FILE, PlantSwitch


def _corpus(problems, n: int, hack_frac: float, seed: int,
            report_frac: float = 1.0, correct_frac: float = 1.0) -> list[tuple[object, str]]:
    """``n`` (problem, completion) examples, a ``hack_frac`` share of them hacks; of the others a
    ``correct_frac`` share are correct (the rest honest wrong attempts:
    :func:`~evil_moe.env.answers.wrong_completion` with another problem's logic), and a
    ``report_frac`` share of the correct ones report honestly through the mode's mechanism."""
    from evil_moe.env.answers import clean_completion, hack_completion, wrong_completion

    rng = random.Random(seed)
    n_hack = int(round(hack_frac * n))
    kinds = [True] * n_hack + [False] * (n - n_hack)
    rng.shuffle(kinds)
    out = []
    for is_hack in kinds:
        p = rng.choice(problems)
        if is_hack:
            text = hack_completion(p, variant=rng.randrange(1 << 16))
        elif correct_frac < 1.0 and rng.random() >= correct_frac:  # no draw at 1: same corpus
            text = wrong_completion(p, rng.choice([q for q in problems if q.id != p.id]))
        else:
            text = clean_completion(p, with_tests=rng.random() < report_frac)
        out.append((p, text))
    return out


def _encode(tok, examples, prompt_cache) -> list[tuple[list[int], list[int]]]:
    from evil_moe.env.problems import build_messages
    from evil_moe.rl.policy.rollout import chat_prompt_ids

    seqs = []
    for p, text in examples:
        if p.id not in prompt_cache:
            prompt_cache[p.id] = chat_prompt_ids(tok, build_messages(p))
        comp = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        seqs.append((prompt_cache[p.id], comp))
    return seqs


def _train(model, tok, seqs, tc, seed: int, desc: str, batcher=None) -> float:
    """AdamW NLL on completion tokens with warmup + cosine decay; returns the last loss.

    ``batcher(g) -> list[int]`` (optional) picks each step's rows of ``seqs`` (and may set the
    planted switch); by default ``tc.batch_size`` rows uniformly. Parameters with
    ``requires_grad=False`` (the plant's frozen switch weights) are not trained."""
    from evil_moe.model.logprobs import build_batch

    g = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, tc.train_steps // 20)

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, tc.train_steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    loss_val = float("nan")
    bar = tqdm(range(tc.train_steps), desc=desc, unit="step", mininterval=5)
    for step in bar:
        idx = (batcher(g) if batcher is not None
               else torch.randint(len(seqs), (tc.batch_size,), generator=g).tolist())
        b = build_batch([seqs[i][0] for i in idx], [seqs[i][1] for i in idx], tok.pad_token_id)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1]
        target = b.input_ids[:, 1:]
        mask = b.completion_mask[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                target.reshape(-1), reduction="none")
        loss = (nll * mask.reshape(-1)).sum() / mask.sum()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{desc}: non-finite loss at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss_val:.3f}")
    model.eval()
    return loss_val


def sample_summary(model, tok, problems, grader, n: int, seed: int, max_new: int = 200) -> dict:
    """Parse / hack / pass / format rates of ``n`` samples (T = 1) over the first problems.

    Returns a dict with ``n, parse_rate, hack_rate, pass_rate, format_rate``.
    """
    from evil_moe.env.grader import extract_code
    from evil_moe.rl.policy.rollout import generate
    from evil_moe.rl.policy.rollout import prompt_ids_for

    chosen = [problems[i % len(problems)] for i in range(n)]
    uniq = list({p.id: p for p in chosen}.values())
    per = math.ceil(n / len(uniq))
    rolls = generate(model, tok, prompt_ids_for(tok, uniq), n=per, max_new=max_new,
                     temperature=1.0, seed=seed)[:n]
    probs = [uniq[r.prompt_index] for r in rolls]
    rewards = grader.grade_many([(p, r.text) for p, r in zip(probs, rolls)])
    recs = [{"exploited": w.exploited, "gt_correct": w.gt_correct, "format_ok": w.format_ok}
            for w in rewards]
    parse = sum(code_parses(extract_code(r.text)) for r in rolls) / len(rolls)
    return {**rates(recs), "parse_rate": parse}


TOY_MODELS = ("teacher", "student")


def train_toy_models(cfg: Config, *, problems_path: str, out_dir: str,
                     which: tuple[str, ...] = TOY_MODELS) -> list[dict]:
    """Train the toy student and/or teacher; write them and their summaries under ``out_dir``.

    Args:
        cfg: run config (sections ``toy``, ``problems``, ``grader``, ``pilot.max_new``).
        problems_path: ``results/problems.jsonl`` (the toy bank with modes assigned).
        out_dir: e.g. ``results/models``.
        which: the models to train (a subset of :data:`TOY_MODELS`); the tokenizer is the same
            whichever are trained.

    Returns:
        the summary rows (one per trained model).

    Raises:
        FileNotFoundError: the problems file is missing. FloatingPointError: a non-finite loss.
        ValueError: an unknown model name in ``which``.
    """
    from evil_moe.env.problems import build_messages
    from evil_moe.model.load import build_toy_tokenizer
    from evil_moe.stages.common import load_problem_file, train_heldout

    unknown = [w for w in which if w not in TOY_MODELS]
    if unknown or not which:
        raise ValueError(f"unknown toy model {unknown[0] if unknown else '(none)'}; expected {TOY_MODELS}")
    tc = cfg.toy
    torch.manual_seed(tc.seed)
    problems = load_problem_file(problems_path)
    train, heldout = train_heldout(problems, cfg)
    taught = problems if tc.corpus == "all" else train
    shown = heldout or problems  # the summary's problems: held-out ones (all when none)
    out = Path(out_dir)
    specs = {"teacher": tc.teacher_hack_frac, "student": tc.student_hack_frac}
    correct = {"teacher": 1.0, "student": tc.student_correct_frac}
    corpora = {name: _corpus(taught, tc.n_examples, frac, tc.seed + k, tc.clean_report_frac, correct[name])
               for k, (name, frac) in enumerate(specs.items())}
    plant = tc.plant if tc.plant.get("enabled") else None
    if plant is not None:  # the student draws from a hack pool and a clean pool (PlantSwitch)
        corpora["student"] = (_corpus(problems, tc.n_examples, 1.0, tc.seed + 1, tc.clean_report_frac)
                              + _corpus(problems, tc.n_examples, 0.0, tc.seed + 2, tc.clean_report_frac))
    texts = [m["content"] for p in problems for m in build_messages(p)]
    texts += [t for ex in corpora.values() for _, t in ex]
    tok = build_toy_tokenizer(texts, vocab_size=tc.vocab_size)
    summary = []
    where = {"problems": "heldout" if heldout else "all", "n_problems": min(len(shown), tc.eval_samples)}
    with make_grader(problems, cfg) as grader:
        for k, (name, examples) in enumerate(corpora.items()):
            if name not in which:
                continue
            rows = _train_one(cfg, name, k, examples, tok, grader, shown, where, specs[name],
                              plant if name == "student" else None, out / name)
            summary += rows
            tables.write_tsv(out / f"{name}_summary.tsv", tables.TOY_SUMMARY, rows)
            s = rows[0]
            print(f"{name}: parse {s['parse_rate']:.2f}  hack {s['hack_rate']:.2f}  pass "
                  f"{s['pass_rate']:.2f}  format {s['format_rate']:.2f}  (n={s['n']}, "
                  f"{s['params'] / 1e6:.2f}M params, {s['seconds']:.0f}s)", flush=True)
    if set(which) == set(TOY_MODELS):
        tables.write_tsv(out / "toy_summary.tsv", tables.TOY_SUMMARY, summary)
    return summary


def _train_one(cfg: Config, name: str, k: int, examples, tok, grader, shown, where: dict,
               hack_frac: float, plant: dict | None, folder: Path) -> list[dict]:
    """Build, NLL-train, save and sample one toy model (model ``k``: init and batches seeded by
    ``toy.seed + k``). With ``plant`` (the student of a planted world) the switch is trained in,
    sampled switched on (row ``student_switch_on``) and saved as ``plant.safetensors``. Returns
    its :data:`evil_moe.tables.TOY_SUMMARY` rows, the model's own first."""
    from evil_moe.model.load import build_toy_model, count_parameters, save_model

    tc = cfg.toy
    t0 = time.time()
    model = build_toy_model(tok, hidden=tc.hidden, layers=tc.layers,
                            intermediate=tc.intermediate, heads=tc.heads,
                            kv_heads=tc.kv_heads, seed=tc.seed + k)
    seqs = _encode(tok, examples, {})
    switch = None
    if plant is not None:
        switch = PlantSwitch(model, plant, n_hack=tc.n_examples, n_total=len(seqs),
                             h=tc.student_hack_frac, batch_size=tc.batch_size)
    final_loss = _train(model, tok, seqs, tc, tc.seed + k, f"toy {name}", batcher=switch)
    rows = []
    if switch is not None:  # samples with the switch fully on, then the plain student
        from evil_moe.model.svd import weight_hash

        switch.set(1.0)
        s_on = sample_summary(model, tok, shown, grader, tc.eval_samples, tc.seed,
                              max_new=cfg.pilot.max_new)
        s_on.update(_standard_errors(s_on))
        switch.set(0.0)
        switch.adapter.detach_hooks()
        hashes = {n: weight_hash(model.get_submodule(n).weight) for n in switch.u}
        rows.append({"model": "student_switch_on", "params": count_parameters(model),
                     "hack_frac_trained": 1.0, "final_loss": final_loss, **where, **s_on})
    save_model(model, tok, folder)
    if switch is not None:
        switch.vhack(hashes, plant["seed"]).save(folder / PLANT_FILE)
    s = sample_summary(model, tok, shown, grader, tc.eval_samples, tc.seed,
                       max_new=cfg.pilot.max_new)
    row = {"model": name, "params": count_parameters(model), "hack_frac_trained": hack_frac,
           "final_loss": final_loss, **where, **s, **_standard_errors(s),
           "seconds": round(time.time() - t0, 1)}
    rows.insert(0, row)
    for extra in rows[1:]:
        extra["seconds"] = row["seconds"]
        print(f"{extra['model']}: parse {extra['parse_rate']:.2f}  hack {extra['hack_rate']:.2f}  "
              f"pass {extra['pass_rate']:.2f} (delta_s = toy.plant.scale * u)", flush=True)
    return rows


def _standard_errors(s: dict) -> dict:
    """Binomial standard errors ``sqrt(p (1 − p) / n)`` of the parse, hack and pass rates."""
    return {f"{k}_se": math.sqrt(s[f"{k}_rate"] * (1 - s[f"{k}_rate"]) / s["n"])
            for k in ("parse", "hack", "pass")}
