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


def _cpuinfo(tmp_path: Path, name: str, flags: str) -> str:
    path = tmp_path / name
    path.write_text(f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: {flags}\n\n"
                    f"processor\t: 1\nflags\t\t: {flags}\n")
    return str(path)


def test_native_builds_are_cached_per_processor_feature_set(tmp_path):
    """llama.cpp compiles for the processor it is built on: a build cached on one processor
    generation must not be found on another (it stops with "Illegal instruction")."""
    from edge_eagle.cpu_key import cpu_key

    older = _cpuinfo(tmp_path, "spr", "fpu sse avx2 avx512f amx_tile amx_int8")
    same = _cpuinfo(tmp_path, "spr-reordered", "amx_int8 amx_tile avx512f avx2 sse fpu")
    newer = _cpuinfo(tmp_path, "gnr", "fpu sse avx2 avx512f amx_tile amx_int8 amx_fp16")
    assert cpu_key(older) == cpu_key(same)
    assert cpu_key(older) != cpu_key(newer)
    assert cpu_key(older).split("-")[0] == cpu_key(newer).split("-")[0]  # the machine type


def test_the_upstream_binary_is_looked_up_under_this_processors_key(tmp_path, monkeypatch):
    from edge_eagle.bench.runners import UPSTREAM_VERSION, upstream_binary
    from edge_eagle.cpu_key import cpu_key

    monkeypatch.delenv("EDGE_EAGLE_UPSTREAM_BIN", raising=False)
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    monkeypatch.setenv("EDGE_EAGLE_CACHE", str(tmp_path))
    unkeyed = tmp_path / f"llama.cpp-{UPSTREAM_VERSION}" / "bin" / "llama-speculative-simple"
    unkeyed.parent.mkdir(parents=True)
    unkeyed.write_text("built on some other processor")
    assert upstream_binary() is None
    keyed = tmp_path / f"llama.cpp-{UPSTREAM_VERSION}-{cpu_key()}" / "bin" / "llama-speculative-simple"
    keyed.parent.mkdir(parents=True)
    keyed.write_text("built here")
    assert upstream_binary() == keyed
    # the script names its cache folder the same way
    script = (Path(__file__).resolve().parents[1] / "scripts" / "build_upstream.sh").read_text()
    assert 'DIR="$CACHE/llama.cpp-$VERSION$SUFFIX"' in script and "cpu_key.py" in script
