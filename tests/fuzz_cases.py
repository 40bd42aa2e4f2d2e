"""Fuzz cases on mutated real files, shared by tests/test_fuzz.py (bounded, in CI) and
tests/fuzz.py (longer runs). Each case builds one mutated input from a random.Random,
feeds it to a reader, and returns "ok" (accepted) or "error" (a clear EdgeEagleError).
Anything else - another exception, a crash or abort of the process, a hang - raises
FuzzFailure with what is needed to reproduce it."""

from __future__ import annotations

import functools
import json
import random
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

from edge_eagle.errors import EdgeEagleError

EDGE_INTS = [0, 1, 2, 3, 7, 63, 64, 65, 255, 4096, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]


class FuzzFailure(AssertionError):
    pass


def _expect_clear_error(fn, what: str) -> str:
    try:
        fn()
    except EdgeEagleError as e:
        msg = str(e)
        if not msg or "\n" in msg.strip() or len(msg) > 400:
            raise FuzzFailure(f"{what}: unclear error message {msg!r}") from None
        return "error"
    except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
        raise FuzzFailure(f"{what}: {type(e).__name__}: {e}") from e
    return "ok"


# --- byte-level mutations ---------------------------------------------------------------------

def mutate_bytes(rng: random.Random, data: bytes, region: int | None = None) -> tuple[bytes, str]:
    """One of: random byte overwrites, an extreme integer written at an aligned offset, a
    truncation, or a copied chunk; confined to data[:region] when given (the header)."""
    region = min(len(data), region or len(data))
    buf = bytearray(data)
    op = rng.choice(["bytes", "int", "truncate", "splice"])
    if op == "bytes":
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(region)] = rng.randrange(256)
    elif op == "int":
        width = rng.choice([4, 8])
        off = rng.randrange(0, max(1, region - width)) & ~3
        buf[off:off + width] = (rng.choice(EDGE_INTS) % 2 ** (8 * width)).to_bytes(width, "little")
    elif op == "truncate":
        del buf[rng.randrange(region):]
    else:
        a, b = sorted(rng.randrange(region) for _ in range(2))
        dst = rng.randrange(region)
        chunk = buf[a:b][:4096]
        buf[dst:dst + len(chunk)] = chunk
    return bytes(buf), op


@functools.lru_cache(maxsize=8)
def _base(path: Path) -> tuple[bytes, int]:
    """A real GGUF's bytes and where its tensor data starts (the end of the part a reader
    parses), read once per file for all the cases mutating it."""
    from edge_eagle.gguf_file import read_gguf

    g = read_gguf(path)
    return path.read_bytes(), min(t.offset for t in g.tensors.values())


# --- the cases ------------------------------------------------------------------------------

def case_gguf_reader(rng: random.Random, base: Path, work: Path) -> str:
    """read_gguf on a real GGUF whose header was mutated."""
    from edge_eagle.gguf_file import read_gguf

    data, header_end = _base(base)
    mutated, op = mutate_bytes(rng, data, header_end)
    path = work / "fuzz.gguf"
    path.write_bytes(mutated)
    return _expect_clear_error(lambda: read_gguf(path), f"read_gguf({base.name}, {op})")


@functools.lru_cache(maxsize=8)
def _scalar_value_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """key -> (byte offset, gguf value type) of every scalar metadata value in the header."""
    from edge_eagle.gguf_file import read_gguf

    g = read_gguf(path)
    data, header_end = _base(path)
    head = data[:header_end]
    out = {}
    for key, (vtype, _) in g.types.items():
        if vtype in (4, 5, 6, 10, 11, 0, 1, 2, 3, 7, 12):
            kb = key.encode()
            at = head.find(struct.pack("<Q", len(kb)) + kb + struct.pack("<I", vtype))
            if at >= 0:
                out[key] = (at + 8 + len(kb) + 4, vtype)
    return out


_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_CHILD = """
import sys
from edge_eagle import EdgeEagle, EdgeEagleError
try:
    drafter = sys.argv[2] if len(sys.argv) > 2 else None
    with EdgeEagle(sys.argv[1], drafter, n_ctx=256, n_threads=1, k=2) as ee:
        ee.generate("Hello", max_tokens=4).result()
except EdgeEagleError as e:
    print(e, file=sys.stderr)
    sys.exit(3)
"""


def mutate_gguf_value(rng: random.Random, base: Path) -> tuple[bytes, str]:
    """A real GGUF with one metadata number (a hyperparameter, a token id...) set to an
    extreme value, the file otherwise intact."""
    offsets = _scalar_value_offsets(base)
    key = rng.choice(sorted(offsets))
    off, vtype = offsets[key]
    width = _WIDTH[vtype]
    if vtype in (6, 12):
        value = rng.choice([0.0, -1.0, 1e-30, 1e30, float("inf"), float("nan")])
        raw = struct.pack("<f" if vtype == 6 else "<d", value)
    else:
        value = rng.choice(EDGE_INTS + [rng.randrange(2 ** (8 * width))])
        raw = (value % 2 ** (8 * width)).to_bytes(width, "little")
    data = bytearray(_base(base)[0])
    data[off:off + width] = raw
    return bytes(data), f"{key}={value!r}"


def case_gguf_load(rng: random.Random, target: Path, work: Path, drafter: Path | None = None,
                   timeout: float = 120.0) -> str:
    """Load a mutated target (or, given a drafter, a mutated drafter) in llama.cpp and
    generate, in a child process: it must finish with output or a clear error, never a
    crash or an abort inside llama.cpp."""
    victim = drafter if drafter is not None else target
    mutated, what = mutate_gguf_value(rng, victim)
    path = work / ("fuzz-drafter.gguf" if drafter is not None else "fuzz-target.gguf")
    path.write_bytes(mutated)
    args = [str(target), str(path)] if drafter is not None else [str(path)]
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FuzzFailure(f"loading {victim.name} with {what} hung for {timeout:.0f} s") from None
    if proc.returncode == 0:
        return "ok"
    if proc.returncode == 3 and proc.stderr.strip() and "\n" not in proc.stderr.strip():
        return "error"
    raise FuzzFailure(f"loading {victim.name} with {what}: exit {proc.returncode}: {proc.stderr.strip()[-600:]}")


def case_safetensors(rng: random.Random, checkpoint: Path, work: Path) -> str:
    """load_checkpoint on a real checkpoint whose model.safetensors was mutated (mostly in
    its JSON header and length prefix)."""
    from edge_eagle.converters.sources import load_checkpoint

    d = _copy_checkpoint(checkpoint, work / "st")
    st = d / "model.safetensors"
    data = st.read_bytes()
    header_len = 8 + struct.unpack("<Q", data[:8])[0]
    mutated, op = mutate_bytes(rng, data, header_len if rng.random() < 0.8 else None)
    st.write_bytes(mutated)
    return _expect_clear_error(lambda: load_checkpoint(d), f"load_checkpoint(safetensors, {op})")


def _json_mutation(rng: random.Random, obj):
    """Replace, delete or retype one value somewhere in a JSON object."""
    paths = []

    def walk(o, path):
        if isinstance(o, dict):
            for k, v in o.items():
                paths.append(path + [k])
                walk(v, path + [k])
        elif isinstance(o, list):
            for i, v in enumerate(o):
                paths.append(path + [i])
                walk(v, path + [i])

    walk(obj, [])
    path = rng.choice(paths)
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    leaf = path[-1]
    choice = rng.choice(["delete", "value"])
    if choice == "delete" and isinstance(parent, dict):
        del parent[leaf]
        return f"del {'.'.join(map(str, path))}"
    value = rng.choice([None, True, False, 0, -1, 1, 3, 2**40, 1e308, -0.5, "", "x", [], {}, [1, 2, 3],
                        [0, 0, 0, 0], {"a": 1}, "LlamaForCausalLMEagle3"])
    parent[leaf] = value
    return f"{'.'.join(map(str, path))}={value!r}"


def case_config(rng: random.Random, checkpoint: Path, target: Path, work: Path) -> str:
    """`edge-eagle convert` on a real checkpoint whose config.json had one value changed,
    deleted or retyped (or its bytes mutated)."""
    from edge_eagle.converters import convert

    d = _copy_checkpoint(checkpoint, work / "cfg")
    cfg_path = d / "config.json"
    if rng.random() < 0.85:
        cfg = json.loads(cfg_path.read_text())
        what = _json_mutation(rng, cfg)
        cfg_path.write_text(json.dumps(cfg))
    else:
        mutated, what = mutate_bytes(rng, cfg_path.read_bytes())
        cfg_path.write_bytes(mutated)
    return _expect_clear_error(lambda: convert(d, target, work / "cfg.gguf", outtype="f32", log=lambda m: None),
                               f"convert(config {what})")


def case_torch_zip(rng: random.Random, bin_path: Path, work: Path) -> str:
    """The pickle-free PyTorch reader on a real torch.save file with a mutated data.pkl or
    mutated zip bytes."""
    from edge_eagle.converters.torch_zip import load_torch_zip

    out = work / "fuzz.bin"
    if rng.random() < 0.7:
        with zipfile.ZipFile(bin_path) as zin, zipfile.ZipFile(out, "w") as zout:
            for item in zin.infolist():
                data = zin.read(item)
                if item.filename.endswith("data.pkl"):
                    data, _ = mutate_bytes(rng, data)
                zout.writestr(item, data)
        what = "data.pkl"
    else:
        data, what = mutate_bytes(rng, bin_path.read_bytes())
        out.write_bytes(data)
    return _expect_clear_error(lambda: load_torch_zip(out), f"load_torch_zip({what})")


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    import shutil

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst
