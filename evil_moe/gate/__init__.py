"""The separation gate, grouped by idea (explained in one place in ``docs/gate.md``):

- :mod:`evil_moe.gate.defaults` — the gate's defaults, read from ``config/schema.yaml``'s ``compare``;
- :mod:`evil_moe.gate.effects` — paired effects on per-completion outcomes, the crossed
  seed × problem cluster bootstrap, the variance components;
- :mod:`evil_moe.gate.power` — power, the minimum detectable effect, the planned SE at other
  sizes and how many more seeds, problems or samples would decide;
- :mod:`evil_moe.gate.rule` — the decision rule: the three criteria, the arm's verdict, Holm's
  correction over arms, the positive control;
- :mod:`evil_moe.gate.judge` — the gate's assembly: ``judge(outcomes, arms, settings, ...)`` from
  the held-out outcomes to the verdict, the criteria rows and each arm's numbers;
- :mod:`evil_moe.gate.ceilings` — ceilings and absorption beside the gate (never criteria);
- :mod:`evil_moe.gate.verdict` — the one place the verdict is put into words (``gate.json``'s
  sentence, ``gate.md``, the report's verdict line, criteria and sweep decision);
- :mod:`evil_moe.gate.figures` — the compare stage's figures;
- :mod:`evil_moe.gate.simulate` — synthetic outcomes with planted effects and the gate simulated
  on them (tests and ``benchmarks/gate_power.py`` only).

The compare stage (:mod:`evil_moe.stages.compare`) loads the pilots, calls
:func:`evil_moe.gate.judge.judge`, writes ``summary.tsv``, ``gate.json`` and ``gate.md`` and draws
the figures.
"""
