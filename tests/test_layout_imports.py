"""The import graph of the evil_moe package has no cycle and every import runs down
the floors (the floors are listed in docs/internals.md, "Floors").

The graph is read from the source with :mod:`ast`, not from an interpreter: every ``import`` and
``from ... import`` anywhere in a module counts — at module level, inside ``if TYPE_CHECKING:``
and inside functions — so an import moved into a function to dodge a cycle is still an edge; so
does a module of the package named in an annotation, quoted (``"evil_moe.x.Y"``) or not (under
``from __future__ import annotations``), so a type spelled by its path cannot hide one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "evil_moe"


def module_name(path: Path, root: Path) -> str:
    """Dotted module name of ``path`` in the package rooted at ``root`` (``__init__`` → package)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules of the same package it imports}`` for every ``.py`` file under ``root``.

    ``from X import Y`` is an edge to ``X.Y`` when that is a module of the package, else to ``X``;
    relative imports are resolved against the importing module's package.
    """
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            targets += annotation_modules(node, root.name)
            for t in targets:
                while t and t not in files:  # ``import evil_moe.env.grader as g`` etc.
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def annotation_modules(node: ast.AST, package: str = "evil_moe") -> list[str]:
    """The dotted names rooted at ``package`` (``evil_moe....``) that ``node``'s annotations spell:
    a function's argument and return annotations, an annotated assignment's; a quoted annotation
    is parsed as the expression it holds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        anns = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                if x is not None and x.annotation is not None] + [node.returns]
    elif isinstance(node, ast.AnnAssign):
        anns = [node.annotation]
    else:
        return []
    out = []
    for ann in (x for x in anns if x is not None):
        inner = {id(n.value) for n in ast.walk(ann) if isinstance(n, ast.Attribute)}
        for sub in ast.walk(ann):
            if id(sub) in inner:  # part of a longer dotted name, read whole below
                continue
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                try:
                    out += annotation_modules(ast.parse(f"x: {sub.value}").body[0], package)
                except SyntaxError:
                    continue
            elif isinstance(sub, ast.Attribute):
                parts = []
                while isinstance(sub, ast.Attribute):
                    parts.append(sub.attr)
                    sub = sub.value
                if isinstance(sub, ast.Name) and sub.id == package:
                    out.append(".".join([package, *reversed(parts)]))
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_evil_moe_imports_have_no_cycle():
    graph = import_graph(PACKAGE)
    assert graph["evil_moe.cli"] and graph["evil_moe.stages.pilot"]  # the graph was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The package's floors, bottom up (docs/internals.md, "Floors"): a module imports only from its
# own floor or a lower one. The ground floor imports nothing of the package.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("evil_moe", "evil_moe.files", "evil_moe.config", "evil_moe.progress"),
    ("evil_moe.tables", "evil_moe.pilots"),
    ("evil_moe.env", "evil_moe.model"),
    # rl's wings, in the order the method reads: each imports only the wings below it
    ("evil_moe.rl", "evil_moe.rl.policy"),
    ("evil_moe.rl.vhack",),
    ("evil_moe.rl.detectors",),
    ("evil_moe.rl.arms",),
    ("evil_moe.rl.trainer",),
    ("evil_moe.gate", "evil_moe.cluster", "evil_moe.checks"),
    ("evil_moe.stages", "evil_moe.workflow"),
    ("evil_moe.cli",),
)
# the wings of rl: every module of rl is in one (a module directly under rl/ would get the
# package's floor without a wing's place in the method)
RL_WINGS = ("policy", "vhack", "detectors", "arms", "trainer")


def floor_of(module: str) -> int:
    """The floor of ``module``: that of the longest :data:`FLOORS` name that is the module or a
    package holding it (the root package ``evil_moe`` names only itself).

    Raises:
        LookupError: no floor names the module (a new subpackage must be given one).
    """
    best = None
    for i, names in enumerate(FLOORS):
        for name in names:
            holds = name != "evil_moe" and module.startswith(name + ".")
            if (module == name or holds) and (
                    best is None or len(name) > len(best[1])):
                best = (i, name)
    if best is None:
        raise LookupError(f"{module} is on no floor: add it to FLOORS and docs/internals.md")
    return best[0]


def imports_up(graph: dict[str, set[str]]) -> list[str]:
    """Every edge of ``graph`` from a module to one on a higher floor, as ``"a -> b"``."""
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if floor_of(d) > floor_of(m))


def test_every_import_runs_down_the_floors():
    graph = import_graph(PACKAGE)
    assert {floor_of(m) for m in graph} == set(range(len(FLOORS)))  # every floor is inhabited
    assert imports_up(graph) == []


def test_every_rl_module_is_in_a_wing():
    graph = import_graph(PACKAGE)
    loose = [m for m in graph if m.startswith("evil_moe.rl.") and m.split(".")[2] not in RL_WINGS]
    assert loose == [], f"rl modules outside the wings {RL_WINGS}: {loose}"
    assert {m.split(".")[2] for m in graph if m.startswith("evil_moe.rl.")} == set(RL_WINGS)


def test_the_ground_floor_imports_nothing_of_the_package():
    graph = import_graph(PACKAGE)
    for m in ("evil_moe.files", "evil_moe.config"):
        assert graph[m] == set(), m
    assert graph["evil_moe.tables"] == {"evil_moe.files"}


def test_floor_check_sees_an_import_that_runs_up():
    """Hand-built graphs: an rl module importing a stage (the shape of the package before the floors),
    the table module importing the arm registry, and a wing importing a higher wing (v_hack
    reading the trainer's step records, a detector the arm registry) are each reported; a stage
    importing rl, and the trainer importing lower wings, are not; a module on no floor is an
    error."""
    graph = {"evil_moe.rl.trainer.trainer": {"evil_moe.stages.common", "evil_moe.rl.policy.grpo",
                                             "evil_moe.rl.arms.registry"},
             "evil_moe.tables": {"evil_moe.rl.arms.registry", "evil_moe.files"},
             "evil_moe.rl.vhack.direction": {"evil_moe.rl.trainer.step", "evil_moe.rl.policy.grpo"},
             "evil_moe.rl.detectors.detector": {"evil_moe.rl.arms.registry"},
             "evil_moe.stages.pilot": {"evil_moe.rl.trainer.trainer"}}
    assert imports_up(graph) == ["evil_moe.rl.detectors.detector -> evil_moe.rl.arms.registry",
                                 "evil_moe.rl.trainer.trainer -> evil_moe.stages.common",
                                 "evil_moe.rl.vhack.direction -> evil_moe.rl.trainer.step",
                                 "evil_moe.tables -> evil_moe.rl.arms.registry"]
    with pytest.raises(LookupError, match="evil_moe.newpkg.x is on no floor"):
        floor_of("evil_moe.newpkg.x")


def test_env_layering():
    """The environment's modules, bottom up: the Problem record, the value model and the source
    helpers import nothing of the package; the loophole modes only the source helpers; the
    answer templates, parsing, judging, grading and the command's helpers each import only what
    lies below them."""
    graph = import_graph(PACKAGE)
    env = {m.rpartition(".")[2]: {d.rpartition(".")[2] for d in deps if d.startswith("evil_moe.env.")}
           for m, deps in graph.items() if m.startswith("evil_moe.env.")}
    assert env["problem"] == set() and env["values"] == set() and env["source"] == set()
    assert env["oracle"] == {"problem", "values"}
    assert env["loopholes"] == {"source"}
    assert env["answers"] == {"loopholes", "problem", "source"}
    assert env["judge"] == {"loopholes", "oracle", "values"}
    assert env["grader"] == {"judge", "loopholes", "oracle", "problem", "sandbox"}
    assert env["problems"] == {"loopholes", "oracle", "problem", "toybank"}
    assert env["grade_cli"] == {"grader", "loopholes", "problem", "problems"}


def test_cycle_finder_sees_every_kind_of_import(tmp_path):
    """A planted package: a cycle closed only by a function-level import, one closed only by
    an ``if TYPE_CHECKING:`` import, one through a relative import, and one closed only by an
    annotation that spells a type by its path (quoted, or under ``from __future__ import
    annotations``) are each found; without them the package is acyclic."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("import os\n\n\ndef f():\n    from pkg.sub import c\n")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from ..d import D\n")
    (pkg / "d.py").write_text("X = 1\n")
    graph = import_graph(pkg)
    assert graph == {"pkg": set(), "pkg.sub": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"},
                     "pkg.sub.c": {"pkg.d"}, "pkg.d": set()}
    assert find_cycle(graph) is None
    (pkg / "d.py").write_text("def g():\n    import pkg.a\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.d", "pkg.a"]
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .sub.c import E\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.sub.c", "pkg.d", "pkg.sub.c"]
    # a type spelled by its path in an annotation, quoted or not, is an edge too
    (pkg / "d.py").write_text('def g(x: "pkg.a.T") -> None:\n    pass\n')
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.d", "pkg.a"]
    (pkg / "d.py").write_text("from __future__ import annotations\n\n\nX: dict[str, pkg.a.T] = {}\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.d", "pkg.a"]
    (pkg / "d.py").write_text('X = "pkg.a.T"  # a string that is no annotation\n')
    assert find_cycle(import_graph(pkg)) is None


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, also inside
    top-level ``if`` / ``try`` blocks) — not the names it imports."""
    out: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        stmts = [node] + ([n for n in ast.walk(node) if n is not node]
                          if isinstance(node, (ast.If, ast.Try)) else [])
        for n in stmts:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    out |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return out


# The console script's entry point (pyproject.toml: evil-moe = "evil_moe.cli:main") is the one
# name a package re-exports.
ENTRY_POINTS = {("evil_moe.cli", "main")}


def imports_through_a_face(root: Path, sources: list[Path]) -> list[str]:
    """``from evil_moe.X import Y`` statements in ``sources`` where ``Y`` is neither a module of
    the package nor a name ``X`` defines (``X`` only imports it: a re-export face), as
    ``"file:line: X.Y"``. ``.smk`` files are read line by line (Snakemake's syntax is not
    Python's)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    cache: dict[str, set[str]] = {}
    pattern = re.compile(r"^\s*from (evil_moe[\w.]*) import (\([^)]*\)|[\w ,]+)", re.M)
    out = []
    for src in sources:
        text = src.read_text()
        if src.suffix == ".py":
            found = [(n.lineno, n.module, [a.name for a in n.names])
                     for n in ast.walk(ast.parse(text, str(src)))
                     if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
        else:
            found = [(text[:m.start()].count("\n") + 1, m.group(1),
                      [x.split(" as ")[0].strip() for x in m.group(2).strip("()").split(",")
                       if x.strip()])
                     for m in pattern.finditer(text)]
        for line, mod, names in found:
            if mod not in files:
                continue
            have = cache.setdefault(mod, defined_names(files[mod]))
            out += [f"{src.name}:{line}: {mod}.{n}" for n in names
                    if n not in have and f"{mod}.{n}" not in files and (mod, n) not in ENTRY_POINTS]
    return out


def test_every_import_names_the_module_that_defines_it():
    """No re-export faces: the package, its tests, benchmarks and rules import each name from the
    module that defines it (a module that re-exports its neighbours' names lets callers stay put
    when code moves, and hides where things live)."""
    repo = PACKAGE.parent
    sources = [*sorted(PACKAGE.rglob("*.py")), *sorted((repo / "tests").rglob("*.py")),
               *sorted((repo / "benchmarks").rglob("*.py")), *sorted((repo / "rules").glob("*.smk")),
               repo / "Snakefile"]
    assert imports_through_a_face(PACKAGE, sources) == []


def test_face_check_sees_a_re_export(tmp_path):
    """A planted package: ``b`` defines ``f``, ``a`` imports it and so re-exports it; importing
    ``f`` from ``a`` is reported, from ``b`` is not, and a submodule import is not."""
    pkg = tmp_path / "evil_moe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("def f():\n    return 1\n\n\nif True:\n    G = 2\n")
    (pkg / "a.py").write_text("from evil_moe.b import G, f  # noqa: F401\n")
    user = tmp_path / "user.py"
    user.write_text("from evil_moe.a import f\nfrom evil_moe.b import G, f\nfrom evil_moe import a\n")
    rules = tmp_path / "x.smk"
    rules.write_text("rule r:\n    run:\n        pass\nfrom evil_moe.a import (G,\n    f)\n")
    assert imports_through_a_face(pkg, [user, rules]) == [
        "user.py:1: evil_moe.a.f", "x.smk:4: evil_moe.a.G", "x.smk:4: evil_moe.a.f"]
