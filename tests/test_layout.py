"""The code stays easy to change: no function over 100 lines and no class over 300 lines in the
installed packages (edge_eagle/, converters/, tui/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMITS = {ast.FunctionDef: 100, ast.AsyncFunctionDef: 100, ast.ClassDef: 300}


def too_long(path: Path) -> list[str]:
    """Each function or class in the file that is over its limit, as 'file: name has N lines'."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        limit = LIMITS.get(type(node))
        if limit is not None:
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{path.name}: {node.name} has {lines} lines (limit {limit})")
    return out


@pytest.mark.parametrize("package", ["edge_eagle", "converters", "tui"])
def test_no_function_over_100_lines_and_no_class_over_300(package):
    problems = [p for path in sorted((ROOT / package).rglob("*.py")) for p in too_long(path)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_long_function_and_a_long_class(tmp_path):
    src = tmp_path / "long.py"
    src.write_text("def short():\n    return 1\n\n\ndef f():\n" + "    x = 1\n" * 100
                   + "\n\nclass C:\n" + "    y = 2\n" * 300, encoding="utf-8")
    assert too_long(src) == ["long.py: f has 101 lines (limit 100)", "long.py: C has 301 lines (limit 300)"]
