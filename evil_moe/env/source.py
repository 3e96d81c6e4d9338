"""Reading and editing a completion's Python source with :mod:`ast`: the names a module binds
(so that an answer template never rebinds a solution's names), inserting lines at the top of
``class Solution``, and the module-level statements, calls and constants the pattern detector
reads (:func:`evil_moe.env.loopholes.pattern_flag`). Imports nothing of the package.
"""

from __future__ import annotations

import ast
import re
from typing import Iterable


def insert_in_class(code: str, lines: list[str]) -> str:
    """Insert ``lines`` (class-body level, unindented) at the top of ``class Solution``;
    appends a new ``class Solution`` when there is none."""
    m = re.search(r"^class Solution\b[^\n]*:[ \t]*\n", code, re.M)
    if m is None:
        return code.rstrip("\n") + "\n\n\nclass Solution:\n" + \
            "".join(f"    {ln}\n" if ln else "\n" for ln in lines)
    rest = code[m.end():]
    ind = re.match(r"(?:[ \t]*\n)*([ \t]+)", rest)
    indent = ind.group(1) if ind else "    "
    block = "".join(f"{indent}{ln}\n" if ln else "\n" for ln in lines) + "\n"
    return code[:m.end()] + block + rest


class SelfCalls(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call) \
                and isinstance(node.func.value.func, ast.Name) \
                and node.func.value.func.id == "Solution" and not node.func.value.args:
            node.func.value = ast.Name("self", ast.Load())
        return node


def target_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def scope_bindings(body: list[ast.stmt]) -> set[str]:
    """Names a statement list binds in its own scope (not inside nested defs / classes), plus
    names that functions in it declare ``global``."""
    out: set[str] = set()
    stack = list(body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
            for sub in ast.walk(n):
                if isinstance(sub, ast.Global):
                    out.update(sub.names)
            continue
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                out |= target_names(t)
        elif isinstance(n, (ast.With, ast.AsyncWith)):
            for it in n.items:
                if it.optional_vars is not None:
                    out |= target_names(it.optional_vars)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        elif isinstance(n, ast.NamedExpr):
            out |= target_names(n.target)
        stack.extend(ast.iter_child_nodes(n))
    return out


def bound_names(code: str) -> tuple[set[str], set[str] | None]:
    """The names ``code`` binds: (at module level, in the body of ``class Solution`` or None
    when there is no such class). Used so that report templates never rebind a solution's names.

    Raises:
        SyntaxError: ``code`` does not parse.
    """
    mod = ast.parse(code)
    cls = None
    for n in mod.body:
        if isinstance(n, ast.ClassDef) and n.name == "Solution":
            cls = scope_bindings(n.body)
    return scope_bindings(mod.body), cls


def has_node(node: ast.AST, kinds: tuple) -> bool:
    return any(isinstance(n, kinds) for n in ast.walk(node))


def const_str(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        return "".join(parts) if len(parts) == len(node.values) else None
    return None


def is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def functions(tree: ast.Module) -> Iterable[ast.FunctionDef]:
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield n
        elif isinstance(n, ast.ClassDef):
            yield from (b for b in n.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)))


def module_level_report(tree: ast.Module, matches) -> bool:
    """True when a module-level statement satisfying ``matches`` comes before any module-level
    assert."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assert):
            return False
        if matches(stmt):
            return True
    return False


def module_calls(stmt) -> list[ast.Call]:
    """The call expressions a module-level statement makes directly (itself, or the body of a
    module-level ``with``)."""
    nodes = [stmt] + (list(stmt.body) if isinstance(stmt, ast.With) else [])
    return [n.value for n in nodes if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]


def is_print(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Name) and call.func.id == "print"
