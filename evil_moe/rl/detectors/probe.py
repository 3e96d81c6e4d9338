"""The labelled-budget probe: a deployable hack detector fitted on labelled calibration rollouts.

A logistic regression on the policy's pooled final hidden state (the mean over a rollout's
completion tokens of the input to the output head, :func:`evil_moe.model.logprobs.pool_completion`),
standardised per feature, fitted on a stated number of labelled rollouts of the calibration runs
(``audit.label_budget``; :mod:`evil_moe.stages.audit`). It is the strong baseline of the detector
audit: every detector that has been reported to work on reward hacking was fitted on labelled
rollouts of the policy (ariahw/rl-rewardhacking: a logistic probe on activations, AUC 0.99,
thresholded at a 5% false-positive rate), and this one says how much a few labels buy here. The
labels are the only oracle use of any training run's detector: they come from the calibration
runs (their own seeds), never from a pilot's own rollouts, and the audit reports how many.

The fit is scikit-learn's ``StandardScaler`` + ``LogisticRegression`` (L2, ``C`` = 1, lbfgs);
the probe stores the scaler's mean and scale and the model's coefficients, so scoring needs only
torch (:meth:`Probe.score`: the logit, ``((h − mean) / scale) · coef + intercept``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Probe", "Folds"]


@dataclass
class Probe:
    """A fitted probe.

    Attributes:
        mean, scale: ``(d,)`` fp64 feature standardisation (``StandardScaler``; a feature with
            no spread has scale 1).
        coef: ``(d,)`` fp64 logistic-regression weights on the standardised features.
        intercept: the bias (logit units).
        meta: ``n_labels`` (rows fitted on), ``n_hack`` (of which hacks), ``seeds`` (calibration
            seeds the rows came from), ``C``.
    """

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    meta: dict = field(default_factory=dict)

    @classmethod
    def fit(cls, hidden, label, *, C: float = 1.0, seed: int = 0, meta: dict | None = None) -> "Probe":
        """Fit on pooled hidden states and hack labels.

        Args:
            hidden: ``(n, d)`` pooled hidden states (array-like, any float dtype).
            label: ``(n,)`` bool, the true hack label (``grade.exploited``) of each row.
            C: inverse L2 strength (scikit-learn's).
            seed: the solver's random state.
            meta: extra metadata to keep (``n_labels``/``n_hack`` are filled in).

        Returns:
            the probe.

        Raises:
            ValueError: fewer than two rows, shapes that disagree, or one class only (a probe
                needs hack and clean rows).
        """
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        X = np.asarray(hidden, dtype=np.float64)
        y = np.asarray(label, dtype=bool)
        if X.ndim != 2 or y.shape != (X.shape[0],):
            raise ValueError(f"hidden {X.shape} and label {y.shape} do not match")
        if X.shape[0] < 2 or y.all() or not y.any():
            raise ValueError(f"a probe needs hack and clean rows: {int(y.sum())} hacks of {len(y)} rows")
        scaler = StandardScaler().fit(X)
        model = LogisticRegression(C=C, max_iter=2000, random_state=seed).fit(scaler.transform(X), y)
        m = dict(meta or {}, n_labels=int(len(y)), n_hack=int(y.sum()), C=float(C))
        return cls(scaler.mean_.copy(), scaler.scale_.copy(), model.coef_[0].astype(np.float64).copy(),
                   float(model.intercept_[0]), m)

    def score(self, hidden):
        """Logit of "hack" for each row: ``((h − mean) / scale) · coef + intercept``.

        Args:
            hidden: ``(n, d)`` torch tensor or array of pooled hidden states.

        Returns:
            ``(n,)`` fp64, the same kind as the input (a torch tensor for a tensor input).

        Raises:
            ValueError: the feature width differs from the probe's.
        """
        d = self.coef.shape[0]
        if hidden.shape[-1] != d:
            raise ValueError(f"the probe has {d} features, the hidden states {hidden.shape[-1]}")
        w = self.coef / self.scale
        b = self.intercept - float(self.mean @ w)
        try:
            import torch

            if isinstance(hidden, torch.Tensor):
                return hidden.double() @ torch.as_tensor(w, device=hidden.device) + b
        except ImportError:  # pragma: no cover
            pass
        return np.asarray(hidden, dtype=np.float64) @ w + b

    def save(self, path: str | os.PathLike) -> Path:
        """Write a safetensors file (tensors ``mean``, ``scale``, ``coef``, ``intercept``;
        ``meta`` as JSON in the metadata). Returns the path."""
        import json

        from safetensors.numpy import save_file

        from evil_moe.files import atomic_path

        path = Path(path)
        with atomic_path(path) as tmp:
            save_file({"mean": self.mean, "scale": self.scale, "coef": self.coef,
                       "intercept": np.array([self.intercept])}, str(tmp),
                      metadata={"format": "evil_moe.probe", "meta": json.dumps(self.meta, sort_keys=True)})
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Probe":
        """Read :meth:`save`'s file.

        Raises:
            FileNotFoundError: no file (names it). ValueError: not a probe file.
            evil_moe.files.DamagedFile: its bytes are not those :meth:`save` wrote (names it).
        """
        import json

        from safetensors import safe_open
        from safetensors.numpy import load_file

        from evil_moe.files import check_intact

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"probe not found: {path}")
        check_intact(path)
        with safe_open(str(path), framework="numpy") as fh:
            md = fh.metadata() or {}
        if md.get("format") != "evil_moe.probe":
            raise ValueError(f"{path} is not a probe file (format {md.get('format')!r})")
        t = load_file(str(path))
        return cls(t["mean"], t["scale"], t["coef"], float(t["intercept"][0]), json.loads(md.get("meta", "{}")))


class Folds:
    """The probe cross-fitted over calibration seeds: for each seed, a probe fitted on labelled
    rows of the other seeds scores that seed's rows (the detector audit's probe,
    :meth:`evil_moe.rl.detectors.registry.Probe.audit`).

    Args:
        seeds, label, steps: ``(n,)`` each scored row's calibration seed, hack label and step.
        hidden: ``(n, d)`` the rows' pooled hidden states.
        seed: the fits' random state (``audit.seed``).
    """

    def __init__(self, seeds: np.ndarray, label: np.ndarray, steps: np.ndarray, hidden: np.ndarray, seed: int):
        self.seeds, self.label, self.steps, self.hidden = seeds, label, steps, hidden
        self.uniq = sorted(set(seeds.tolist()))
        self.seed = seed

    def draw(self, pool: np.ndarray, budget: int, rng) -> np.ndarray | None:
        """``budget`` rows of ``pool`` with both classes (up to 20 tries; None if impossible)."""
        k = min(budget, len(pool))
        for _ in range(20):
            pick = np.sort(rng.choice(pool, size=k, replace=False))
            y = self.label[pick]
            if y.any() and not y.all():
                return pick
        return None

    def scores(self, budget: int, rng, *, shuffle: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """Cross-fitted probe scores of every row (the fold's probe never saw the row's seed),
        each fold fitted on ``budget`` labelled rows, and the fitted rows' mask; labels permuted
        within each step of the fitting draw when ``shuffle`` (the placebo). None when a fold
        cannot be fitted."""
        out = np.full(len(self.label), np.nan)
        fitted = np.zeros(len(self.label), dtype=bool)
        for u in self.uniq:
            pool = np.flatnonzero(self.seeds != u)
            pick = self.draw(pool, budget, rng)
            if pick is None:
                return None
            y = self.label[pick].copy()
            if shuffle:
                for st in set(self.steps[pick].tolist()):
                    at = np.flatnonzero(self.steps[pick] == st)
                    y[at] = rng.permutation(y[at])
                if y.all() or not y.any():
                    return None
            probe = Probe.fit(self.hidden[pick], y, seed=self.seed)
            mine = self.seeds == u
            out[mine] = probe.score(self.hidden[mine])
            fitted[pick] = True
        return out, fitted

    def crossfit_flags(self, score: np.ndarray, fitted: np.ndarray, quantile: float) -> np.ndarray:
        """The probe's cross-fitted flags: a seed's rows against the ``quantile`` of the clean
        scores of the other seeds' rows that no fold fitted on (of all their clean rows when
        every one was fitted on)."""
        y, seeds = self.label, self.seeds
        flags = np.zeros(len(score), dtype=bool)
        for u in self.uniq:
            ref = (seeds != u) & ~y & ~fitted
            if not ref.any():
                ref = (seeds != u) & ~y
            flags[seeds == u] = score[seeds == u] > float(np.quantile(score[ref], quantile))
        return flags

    def final(self, budget: int, rng) -> tuple[Probe | None, dict]:
        """The pilots' probe: fitted on ``budget`` rows drawn from every calibration seed, and
        its ``calibration.json`` entry (the clean scores of the rows it did not see, its label
        counts and seeds); ``(None, {})`` when no draw has both classes."""
        pick = self.draw(np.arange(len(self.label)), budget, rng)
        if pick is None:
            return None, {}
        probe = Probe.fit(self.hidden[pick], self.label[pick], seed=self.seed,
                          meta={"seeds": [int(s) for s in self.uniq], "budget": int(budget)})
        rest = np.ones(len(self.label), dtype=bool)
        rest[pick] = False
        clean = rest & ~self.label
        return probe, {"clean_scores": [float(x) for x in probe.score(self.hidden[clean])],
                       "n_labels": int(len(pick)), "n_hack": int(self.label[pick].sum()),
                       "seeds": [int(s) for s in self.uniq]}
