"""The arms that act along a direction V in δS's coordinates (docs/method.md, "Projection"):
erase (the hack-ward part of the step removed, along v_hack), random_v (its control, a random V),
subtract and subtract_random (the removed part trains δS_hack, ablated at deploy), and the
planted world's ceiling erase_planted. Registered in :data:`evil_moe.rl.arms.registry.ARMS`.
"""

from __future__ import annotations

from typing import ClassVar

from evil_moe.rl.arms.base import Arm


class _Project(Arm):
    """Shared body of the projecting arms: ``mode`` erase or subtract along ``v``."""

    mode: ClassVar[str] = "erase"

    def on_gradients(self, adapter, v, optimizer, cfg):
        from evil_moe.rl.vhack.projection import project, project_preconditioned

        if cfg.projection == "gradient":
            return project(adapter, v, self.mode, gate=cfg.gate,
                           preserve_magnitude=cfg.preserve_magnitude)
        if cfg.projection == "preconditioned":
            return project_preconditioned(adapter, v, optimizer, self.mode, gate=cfg.gate)
        return None

    def on_update(self, adapter, v, before, cfg):
        if cfg.projection != "update":
            return None
        from evil_moe.rl.vhack.projection import project

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
        from evil_moe.rl.vhack.projection import project

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


class ErasePlanted(Erase):
    """Erase along the planted hack switch (``toy.plant``; docs/planted.md) instead of the
    extracted v_hack: the ceiling of erase in the planted world — what erase achieves when its V
    is exactly right. Never a treatment and never read by one; judged against ``random_v`` (the
    same projection along a random V) and vanilla. Its V is ``vhack/planted.safetensors``
    (k = 1 in each switch module, none elsewhere), passed to the pilot as ``--planted-vhack``."""

    name = "erase_planted"
    colour = None  # not Erase's: figures draw it in their fallback colour
    role = "ceiling"
    uses_labels = ("planted",)  # the world's true direction: a ceiling, though it reads no label
    control = "random_v"
    vhack = "planted"
    description = ("erase along the planted hack direction u (toy.plant): the ceiling of erase in "
                   "the planted world (control random_v)")
