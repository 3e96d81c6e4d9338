"""The shortcut direction of Advantage Modification (Wu & Tang 2026, arXiv:2604.01476) and the
rollouts' scores along it (the arms: :mod:`evil_moe.rl.arms.by_advantage`; the step's part:
:mod:`evil_moe.rl.trainer.advantage_step`).

A sequence's activation at layer ``ℓ`` is the residual stream after ``ℓ`` decoder layers
(``hidden_states[ℓ]`` of a transformers causal LM; ``ℓ = advantage_mod.layer``, by default
``n_layers // 2``), averaged over the completion's tokens (:func:`layer_hidden`). The direction
is the unit difference of the mean activations of the authored hack and clean completions
(:func:`evil_moe.rl.detectors.router.v_act` at layer ``ℓ``): contrastive pairs written once,
no label of the run's own rollouts. Its matched control is a random unit vector at the same
layer (:func:`evil_moe.rl.detectors.router.random_direction`): the same norm, drawn from a seed.
A rollout's score is the projection ``⟨h, v⟩`` (:func:`shortcut_scores`).
"""

from __future__ import annotations

import torch

__all__ = ["n_layers", "resolve_layer", "layer_hidden", "shortcut_scores"]


def n_layers(model) -> int:
    """Decoder layers of a transformers causal LM (its text config's ``num_hidden_layers``).

    Raises:
        ValueError: the config does not say.
    """
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n = getattr(cfg, "num_hidden_layers", None)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{type(model).__name__}: no num_hidden_layers in its config to read a middle layer at")
    return n


def resolve_layer(layer: int | None, depth: int) -> int:
    """The layer activations are read at: ``layer`` (``advantage_mod.layer``), or ``depth // 2``
    when None (mid depth for any depth; at least 1).

    Raises:
        ValueError: ``layer`` outside ``[1, depth]`` (names the key and the model's depth).
    """
    if layer is None:
        return max(depth // 2, 1)
    if not 1 <= int(layer) <= depth:
        raise ValueError(f"advantage_mod.layer {layer} is outside [1, {depth}] (the model has {depth} layers)")
    return int(layer)


@torch.no_grad()
def layer_hidden(model, batch, layer: int) -> torch.Tensor:
    """Each row's activation at ``layer``, averaged over its completion tokens.

    Args:
        model: the causal LM as it is now (adapter view set by the caller).
        batch: :class:`evil_moe.model.logprobs.Batch` on the model's device.
        layer: index into ``hidden_states`` (0 = the embeddings, ``n`` = after ``n`` layers).

    Returns:
        ``(B, d)`` fp32 on the CPU (zeros for a row without completion tokens).
    """
    from evil_moe.model.logprobs import pool_completion

    kw = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True,
              use_cache=False)
    try:
        out = model(**kw, logits_to_keep=1)
    except TypeError:
        out = model(**kw)
    return pool_completion(out.hidden_states[layer], batch.completion_mask).float().cpu()


def shortcut_scores(hidden: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """``⟨h_b, v⟩`` per row: ``hidden (B, d)``, ``direction (d,)``. Returns ``(B,)`` fp64.

    Raises:
        ValueError: the widths differ.
    """
    if hidden.shape[-1] != direction.shape[-1]:
        raise ValueError(f"activations of width {hidden.shape[-1]} and a direction of width {direction.shape[-1]}")
    return hidden.double() @ direction.double().cpu()
