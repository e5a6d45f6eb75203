"""The names a test reads from the program it tests (shared by ``sandbox.splittable`` and
the trusted judge, ``sandbox_judge.py``, which loads it as a sibling script module)."""

import ast
import builtins


def free_names(test: str) -> list[str]:
    """Names the test reads but never binds, builtins excluded, in order of first use."""
    tree = ast.parse(test)
    bound, read = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            read.append(node.id)
        elif isinstance(node, ast.Name):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    names = dict.fromkeys(n for n in read if n not in bound and not hasattr(builtins, n))
    return list(names)
