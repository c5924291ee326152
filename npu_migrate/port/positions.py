"""Where a change or finding is in the input: line and column, measured per top-level statement.

Usage::

    locate = locator(module, wrapper, source)
    line, col = locate(node, top_level_statement)

libcst's ``PositionProvider`` generates the code of the whole module to count positions, which
costs about as much as parsing it; :func:`locator` measures only the statements that hold a change
or finding and places them with the statement lines of Python's ``ast``. Used by
:func:`npu_migrate.port.transformer.transform`.
"""

from __future__ import annotations

import ast
from typing import Any, Optional

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


def _statement_lines(module: cst.Module, source: str) -> Optional[list[int]]:
    """The first line of each top-level statement of ``module``, from Python's own (fast) parser."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    body, lines, i = tree.body, [], 0
    for stmt in module.body:
        if i >= len(body):
            return None
        node = body[i]
        decorators = getattr(node, "decorator_list", None)
        lines.append(decorators[0].lineno if decorators else node.lineno)
        i += len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
    return lines if i == len(body) else None


def locator(module: cst.Module, wrapper: MetadataWrapper, source: Optional[str]) -> Any:
    """``(node, top-level statement) -> (line, column)`` in the input.

    libcst's PositionProvider generates the code of the whole module to count positions, which
    costs about as much as parsing it. Only the statements that hold a change or finding are
    measured here, each on its own, and placed with the statement lines of Python's ``ast``; the
    whole-module provider is the fallback.
    """
    starts = _statement_lines(module, source) if source is not None else None
    index = {id(stmt): i for i, stmt in enumerate(module.body)}
    cache: dict[int, tuple[Any, int]] = {}
    whole: list[Any] = []

    def fallback(node: cst.CSTNode) -> tuple[int, int]:
        if not whole:
            whole.append(wrapper.resolve(PositionProvider))
        start = whole[0][node].start
        return start.line, start.column + 1

    def locate(node: cst.CSTNode, top: Optional[cst.CSTNode]) -> tuple[int, int]:
        if starts is None or top is None or id(top) not in index:
            return fallback(node)
        entry = cache.get(id(top))
        if entry is None:
            positions = MetadataWrapper(cst.Module(body=[top]), unsafe_skip_copy=True).resolve(PositionProvider)
            decorators = getattr(top, "decorators", None)
            first = decorators[0] if decorators else top  # ast's line of a decorated definition
            entry = cache[id(top)] = (positions, starts[index[id(top)]] - positions[first].start.line)
        positions, offset = entry
        start = positions[node].start
        return start.line + offset, start.column + 1

    return locate
