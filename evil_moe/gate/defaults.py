"""The gate's defaults, read from their one home: the ``compare`` section of ``config/schema.yaml``.

The keyword defaults of :mod:`evil_moe.gate` (``min_seeds=MIN_SEEDS``, ``ci=CI``, …) are these
names, never restated literals, so a default changed in the schema changes the functions' too.
``tests/test_gate_defaults.py`` holds them equal to the schema and to a default-filled config.
"""

from __future__ import annotations

from evil_moe.config import load_schema

#: ``compare.*`` defaults as the schema declares them (``{key: default}``).
COMPARE_DEFAULTS: dict = {k: v["default"] for k, v in load_schema()["properties"]["compare"]["properties"].items()
                          if "default" in v}

MIN_DROP: float = float(COMPARE_DEFAULTS["min_drop"])          # rate points
PASS_MARGIN: float = float(COMPARE_DEFAULTS["pass_margin"])    # rate points (absolute margin)
MIN_SEEDS: int = int(COMPARE_DEFAULTS["min_seeds"])
N_BOOT: int = int(COMPARE_DEFAULTS["n_boot"])
CI: float = float(COMPARE_DEFAULTS["ci"])
POWER: float = float(COMPARE_DEFAULTS["power"])
SEED: int = int(COMPARE_DEFAULTS["seed"])
RESAMPLE: str = str(COMPARE_DEFAULTS["resample"])
MULTIPLICITY: str = str(COMPARE_DEFAULTS["multiplicity"])
