"""Which mean direction the extraction projects out of D (vhack.remove_mean).

A synthetic world where the answer is known by hand: every completion's NLL gradient shares a
generic direction ``a = 3 e0``; a hack's gradient adds a hack direction ``h = 2 e1``; small noise.
Then the hack−clean differences D point along e1, the clean completions' mean along e0 (⊥ h), and
the mean over both completions along ``a + h/2`` = (3, 1, 0, …)/√10, which carries e1.
"""

import math

import pytest
import torch

from evil_moe.rl.vhack.checks import removed_mean
from evil_moe.rl.vhack.direction import extract_vhack


def _world(n=40, r=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.zeros(r, dtype=torch.float64)
    a[0] = 3.0
    h = torch.zeros(r, dtype=torch.float64)
    h[1] = 2.0
    clean = a + 0.05 * torch.randn(n, r, generator=g, dtype=torch.float64)
    hack = a + h + 0.05 * torch.randn(n, r, generator=g, dtype=torch.float64)
    return {"m": hack}, {"m": clean}


def test_clean_mean_is_the_clean_completions_unit_mean():
    first, second = _world()
    got = removed_mean(first, second, list(range(40)), "clean")["m"]
    want = second["m"].mean(0)
    assert torch.allclose(got, want / want.norm())
    # by hand: ≈ e0
    assert got[0] == pytest.approx(1.0, abs=1e-3)


def test_all_mean_carries_half_the_hack_direction():
    first, second = _world()
    got = removed_mean(first, second, list(range(40)), "all")["m"]
    # (a + h/2)/|a + h/2| = (3, 1)/sqrt(10)
    assert got[0] == pytest.approx(3 / math.sqrt(10), abs=2e-3)
    assert got[1] == pytest.approx(1 / math.sqrt(10), abs=2e-3)


def test_none_removes_nothing_and_unknown_is_refused():
    first, second = _world()
    assert removed_mean(first, second, [0, 1], "none") is None
    with pytest.raises(ValueError, match="vhack.remove_mean"):
        removed_mean(first, second, [0, 1], "true")


def test_clean_mean_keeps_the_hack_direction_all_loses_part_of_it():
    first, second = _world()
    rows = list(range(40))
    D = {"m": (first["m"] - second["m"]).float()}
    energy = {}
    for how in ("clean", "all"):
        mean = removed_mean(first, second, rows, how)
        v = extract_vhack(D, 1, remove=mean)
        energy[how] = v.meta["removed_energy"]
        top = v.V["m"][0].double()
        if how == "clean":
            # D ≈ h ⊥ e0: nothing of it is removed, V's axis is e1
            assert abs(top[1]) > 0.999
            # noise only: 2 × 0.05² of variance along e0 over |D|² ≈ 4, about 0.0012
            assert energy[how] < 0.005
    # projecting out (3, 1)/sqrt(10) removes 1/10 of D's energy along e1 (cos² = 0.1)
    assert energy["all"] == pytest.approx(0.1, abs=0.01)
