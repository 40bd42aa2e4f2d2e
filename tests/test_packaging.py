"""What `pip install edge-eagle` installs: every package folder, and only under edge_eagle."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_installed_under_edge_eagle():
    cfg = _config()
    mapped = {pkg: ROOT / d for pkg, d in cfg["package-dir"].items()}
    found = set()
    for init in ROOT.glob("**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts[0] in ("tests", "scripts", ".venv", "build") or any(p.startswith(".") for p in rel.parts):
            continue
        for pkg, folder in mapped.items():
            if init.parent == folder or folder in init.parent.parents:
                found.add(".".join([pkg, *init.parent.relative_to(folder).parts]))
                break
        else:
            found.add(".".join(rel.parts))
    assert set(cfg["packages"]) == found
    assert all(p == "edge_eagle" or p.startswith("edge_eagle.") for p in cfg["packages"])


def test_no_code_imports_the_folders_by_their_top_level_names():
    """converters/ and tui/ exist only as edge_eagle.converters and edge_eagle.tui once installed."""
    offenders = []
    for path in [*ROOT.glob("edge_eagle/**/*.py"), *ROOT.glob("converters/*.py"), *ROOT.glob("tui/*.py"),
                 *ROOT.glob("tests/*.py"), *ROOT.glob("scripts/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("converters", "tui")]
    assert not offenders


def test_moved_modules_keep_working_under_their_old_names():
    import importlib

    for old, new in (("edge_eagle.reference", "edge_eagle.checks.reference"),
                     ("edge_eagle.parity", "edge_eagle.checks.parity"),
                     ("edge_eagle.peers", "edge_eagle.checks.peers"),
                     ("edge_eagle.train.drafter", "edge_eagle.train.pipeline")):
        assert importlib.import_module(old) is importlib.import_module(new), old
    from edge_eagle.reference import Eagle3Config  # what apps import from the old name
    from edge_eagle.train.pipeline import init_model, train_drafter  # noqa: F401
    assert Eagle3Config.__module__ == "edge_eagle.checks.reference"
