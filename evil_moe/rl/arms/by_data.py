"""The arms that act on data (docs/method.md, "Routing and filtering by data"): route (flagged
samples train only δS_hack) and filter (flagged samples are dropped), their random-flag controls
and their ceilings with the true hack label (at the label's rate and at the treatment's dose).
Registered in :data:`evil_moe.rl.arms.registry.ARMS`.
"""

from __future__ import annotations

from evil_moe.rl.arms.base import Arm, split_by_flags, sum_rows, uniform_split


class Route(Arm):
    """Gradient Routing by data (Cloud et al. 2024, arXiv:2410.04332): a detector flags samples;
    a flagged sample's gradient trains only ``δS_hack``, an unflagged one only ``δS``. The forward
    uses ``δS + δS_hack`` (so both knobs see the same per-sample gradient); deploy ablates
    ``δS_hack``. One AdamW over the summed knob, its update split by what is routed to each
    (:class:`evil_moe.rl.policy.optim.SplitAdamW`): a knob moves only by its routed gradients' share of
    the step, never by momentum of its own. With ``pilot.route_unflagged: both`` the unflagged
    rows train both knobs (the paper's §4.3: unlabelled data updates every parameter; only
    labelled data is masked), which lets the quarantine absorb what the detector missed.

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
    control = "route_dose_matched"
    ceiling = "route_oracle"
    dose_ceiling = "route_oracle_dose"
    views = ("ablated", "trained")
    trains_delta_s_hack = True
    splits_gradient = True
    needs_sample_grads = True
    description = ("routing by data: detector-flagged samples train only delta_s_hack, the others "
                   "only delta_s; deploy ablates delta_s_hack")

    def flags(self, inputs):
        return inputs.detected()

    def baseline(self, cfg) -> str:
        return cfg.route_advantages

    def split_gradients(self, per_row, flags, cfg=None):
        both = cfg is not None and getattr(cfg, "route_unflagged", "delta_s") == "both"
        return split_by_flags(per_row, flags, keep_flagged=True, unflagged_both=both)


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


class _DoseMatched:
    """Mixin of the dose-matched controls: no flags; every rollout's gradient is split alike
    (:func:`evil_moe.rl.arm.uniform_split`) so that the share of the step's gradient energy sent
    to δS_hack equals the matched arm's share at that step (:class:`evil_moe.rl.arm.DoseMatch`,
    from its ``steps.tsv`` ``hack_expert_share``): the same dose of deletion, chosen without
    looking at any rollout. Never reads the detector or the label."""

    match_by = "dose"
    needs_sample_grads = False

    def flags(self, inputs):
        return None

    def baseline(self, cfg) -> str:
        return "group"

    def split_gradients(self, per_row, flags, cfg=None, dose=None):
        if dose is None:
            raise ValueError(f"{self.name} deletes at {self.matches}'s per-step dose: dose missing "
                             "(run_pilot's match_flags)")
        return uniform_split(sum_rows(per_row, range(len(per_row))), dose)


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
    dose_ceiling = None
    matches = "route"
    description = "route with flags at random positions at route's per-step flag rate (route's control)"


class RouteOracle(_LabelFlags, Route):
    name = "route_oracle"
    colour = "#8c1d1d"
    role = "ceiling"
    control = "route_oracle_dose_matched"
    ceiling = None
    dose_ceiling = None
    description = ("ceiling: route with the true hack label as the flags (a perfect detector); "
                   "never a treatment")


class RouteOracleRandom(_RandomFlags, Route):
    name = "route_oracle_random"
    colour = "#e7a1a1"
    role = "control"
    control = None
    ceiling = None
    dose_ceiling = None
    matches = "route_oracle"
    description = "route with random flags at route_oracle's per-step flag rate (the ceiling's control)"


class RouteOracleDoseMatched(_DoseMatched, Route):
    name = "route_oracle_dose_matched"
    colour = "#c7a0a0"
    role = "control"
    control = None
    ceiling = None
    dose_ceiling = None
    matches = "route_oracle"
    description = ("route_oracle's dose-matched control: every rollout's gradient split alike so that "
                   "delta_s_hack gets route_oracle's per-step share of the gradient energy")


class RouteDoseMatched(_DoseMatched, Route):
    name = "route_dose_matched"
    colour = "#f4c6c6"
    role = "control"
    control = None
    ceiling = None
    dose_ceiling = None
    matches = "route"
    description = ("route's dose-matched control: every rollout's gradient split alike so that "
                   "delta_s_hack gets route's per-step share of the gradient energy")


class MoEDoseMatched(_DoseMatched, Route):
    name = "moe_dose_matched"
    colour = "#b8e4ea"
    role = "control"
    control = None
    ceiling = None
    dose_ceiling = None
    matches = "moe"
    description = ("moe's dose-matched control: no router; every rollout's gradient split alike so that "
                   "delta_s_hack gets moe's per-step share of the gradient energy")


class _LabelFlagsAtDose:
    """Mixin of the dose-matched ceilings: as many flags per step as the matched arm flagged
    (:class:`FlagRateMatch`, as its random-flag control), drawn among the true hack rows
    (precision 1; every hack row when there are fewer of them than the count)."""

    reads_label = True

    def flags(self, inputs):
        import torch

        if inputs.label is None:
            raise ValueError(f"{self.name} needs the true hack label")
        if inputs.target_count is None:
            raise ValueError(f"{self.name} flags at {self.matches}'s per-step count: target_count missing "
                             "(run_pilot's match_flags)")
        out = torch.zeros(len(inputs.label), dtype=torch.bool)
        hack = torch.nonzero(inputs.label, as_tuple=False).flatten().tolist()
        k = min(int(inputs.target_count), len(hack))
        if k:
            out[torch.as_tensor(inputs.rng.choice(hack, size=k, replace=False))] = True
        return out


class RouteOracleDose(_LabelFlagsAtDose, Route):
    """route_oracle at route's dose: the true hack label, but only as many flagged rows per step
    as route's detector flagged (precision 1 at route's flag budget), so route is set beside a
    perfect detector that routes as little as route does. Its matched control is route's own
    (route_random: random rows at the same per-step count)."""

    name = "route_oracle_dose"
    colour = "#b25c5c"
    role = "ceiling"
    control = "route_random"
    ceiling = None
    dose_ceiling = None
    matches = "route"
    description = ("ceiling at route's dose: the true hack label, flagging only as many rows per step as "
                   "route flagged (precision 1 at route's flag budget); control route_random")


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

    def split_gradients(self, per_row, flags, cfg=None):
        return split_by_flags(per_row, flags, keep_flagged=False)


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
