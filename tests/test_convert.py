"""`edge-eagle convert`: every layout converts, loads in llama.cpp and matches the reference
logits of the model the checkpoint was written from; every bad input is refused cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from edge_eagle.converters import convert
from edge_eagle.converters.convert import TOLERANCE

from edge_eagle import EdgeEagle
from edge_eagle.checks.parity import verify_drafter
from edge_eagle.errors import EdgeEagleError
from edge_eagle.gguf_file import read_gguf
from tests.test_errors import assert_clean_error, cli
from tests.tiny_models import LAYOUT_FLAGS, layout_reference, write_checkpoint

quiet = dict(log=lambda m: None)


@pytest.fixture(scope="module")
def references(tiny_target):
    return {layout: layout_reference(layout, tiny_target, seed=i + 20) for i, layout in enumerate(LAYOUT_FLAGS)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, references):
    root = tmp_path_factory.mktemp("ckpt")
    return {layout: write_checkpoint(root / layout, layout, model) for layout, model in references.items()}


@pytest.mark.parametrize("layout", list(LAYOUT_FLAGS))
def test_layout_converts_and_matches_the_source_model(layout, checkpoints, references, tiny_target, tmp_path):
    out = tmp_path / f"{layout}.gguf"
    logs: list[str] = []
    # the eagle3.1 fixture is SpecForge-shaped and sets norm_output: its reading must be stated
    reading = dict(norm_output="feedback") if layout == "eagle3.1" else {}
    report = convert(checkpoints[layout], tiny_target, out, outtype="f32", log=logs.append, **reading)
    assert report.layout == layout, "detected from content"
    assert any(line.startswith("layout: ") for line in logs)
    cfg, src = report.config, references[layout].cfg
    assert cfg.target_layers == src.target_layers
    for flag in ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual", "has_embedding"):
        assert getattr(cfg, flag) == getattr(src, flag), flag
    c = verify_drafter(out, tiny_target, references[layout])
    assert c.relative_error <= TOLERANCE["f32"] and c.top1_agreement == 1.0
    g = read_gguf(out)
    assert g.meta["edge_eagle.layout"] == layout
    assert g.meta["edge_eagle.target_vocab_fingerprint"] == read_gguf(tiny_target).vocab_fingerprint()
    # and it runs speculatively, lossless against plain decoding
    with EdgeEagle(tiny_target, out, k=3) as ee:
        plain = ee.generate("Once upon a time", max_tokens=20, speculative=False).result().tokens
        assert ee.generate("Once upon a time", max_tokens=20).result().tokens == plain


@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0"])
def test_outtypes_stay_within_tolerance(outtype, checkpoints, references, tiny_target, tmp_path):
    out = tmp_path / f"d-{outtype}.gguf"
    report = convert(checkpoints["eagle3.1"], tiny_target, out, outtype=outtype, verify=True, norm_output="feedback",
                     **quiet)
    assert report.verify["ok"], report.verify
    c = verify_drafter(out, tiny_target, references["eagle3.1"])
    assert c.relative_error <= TOLERANCE[outtype]
    sizes = {t.type.name for t in read_gguf(out).tensors.values()}
    assert {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}[outtype] in sizes


@pytest.mark.parametrize("weights", ["sharded", "bin"])
def test_sharded_safetensors_and_weights_only_bin(weights, references, tiny_target, tmp_path):
    ckpt = write_checkpoint(tmp_path / weights, "specforge", references["specforge"], weights=weights)
    out = tmp_path / "d.gguf"
    convert(ckpt, tiny_target, out, outtype="f32", **quiet)
    assert verify_drafter(out, tiny_target, references["specforge"]).relative_error <= TOLERANCE["f32"]


@pytest.mark.parametrize("container", ["raw pickle", "torch zip"])
def test_bin_with_code_is_never_unpickled(container, tmp_path, tiny_target, checkpoints):
    import pickle
    import shutil

    d = tmp_path / "evil"
    shutil.copytree(checkpoints["safeailab"], d)
    (d / "model.safetensors").unlink()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    if container == "raw pickle":
        (d / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": Evil()}))
    else:
        torch.save({"fc.weight": Evil()}, d / "pytorch_model.bin")
    with pytest.raises(EdgeEagleError, match="PyTorch"):
        convert(d, tiny_target, tmp_path / "o.gguf", **quiet)
    assert not marker.exists()


def test_cli_convert_verify_json_and_upstream_loadability(checkpoints, tiny_target, tmp_path):
    out = tmp_path / "cli.gguf"
    proc = cli("convert", str(checkpoints["speculators"]), "--target", str(tiny_target), "-o", str(out),
               "--outtype", "q8_0", "--verify", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["layout"] == "speculators" and info["verify"]["ok"]
    # this fixture's config.json is not one speculators itself loads: said, and no misread claimed
    peer = info["verify"]["peer"]
    assert peer is None or (peer["ran"] is False and "could not load" in peer["why"])
    assert any("norm_before_residual" in a for a in info["assumptions"])
    # plain llama-cpp-python, no edge_eagle import: load, encode a feature row, decode a row
    script = textwrap.dedent(f"""
        import ctypes, numpy as np
        from llama_cpp import llama_cpp as C
        C.llama_backend_init()
        mp = C.llama_model_default_params()
        tgt = C.llama_model_load_from_file({str(tiny_target)!r}.encode(), mp)
        ctx_t = C.llama_init_from_model(tgt, C.llama_context_default_params())
        dft = C.llama_model_load_from_file({str(out)!r}.encode(), mp)
        assert dft, "drafter did not load"
        cp = C.llama_context_default_params(); cp.ctx_other = ctx_t
        ctx = C.llama_init_from_model(dft, cp)
        assert ctx, "no drafter context"
        b = C.llama_batch_ext_init(ctx)
        feat = np.ones(3 * 64, np.float32)
        pos = C.llama_pos(0)
        i = C.llama_batch_ext_add_embd(b, 0, C.llama_embd(feat.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, 192))
        C.llama_batch_ext_set_pos(b, i, ctypes.byref(pos)); C.llama_batch_ext_set_output_logits(b, i, True)
        assert C.llama_process(ctx, C.LLAMA_PROCESS_TYPE_ENCODE, b) == 0
        C.llama_batch_ext_clear(b)
        g = np.ones(64, np.float32)
        i = C.llama_batch_ext_add_token(b, 0, 42)
        C.llama_batch_ext_set_pos(b, i, ctypes.byref(pos))
        C.llama_batch_ext_set_embd_token(b, i, C.llama_embd(g.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, 64))
        C.llama_batch_ext_set_output_logits(b, i, True)
        assert C.llama_process(ctx, C.LLAMA_PROCESS_TYPE_DECODE, b) == 0
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]


# --- bad input: one line, exit 2, nothing written -----------------------------------------

def _bad(tmp_path: Path, src: Path, target: Path, *words: str, extra: tuple[str, ...] = ()) -> None:
    out = tmp_path / "out.gguf"
    assert_clean_error(cli("convert", str(src), "--target", str(target), "-o", str(out), *extra), *words)
    assert not out.exists() and not list(tmp_path.glob("*out.gguf*"))  # no temp file left either


def _edit(tmp_path: Path, model, layout: str = "safeailab", **overrides):
    return write_checkpoint(tmp_path / "edited", layout, model, config_overrides=overrides or None)


def _rewrite(ckpt: Path, change) -> Path:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(ckpt / "model.safetensors"))
    return ckpt


def test_unknown_layout(tmp_path, references, tiny_target):
    ckpt = _rewrite(_edit(tmp_path, references["safeailab"]),
                    lambda t: [t.update({"foo." + k: t.pop(k)}) for k in list(t)])
    _bad(tmp_path, ckpt, tiny_target, "Unknown checkpoint layout", "expected one of")


def test_missing_tensor(tmp_path, references, tiny_target):
    ckpt = _rewrite(_edit(tmp_path, references["safeailab"]), lambda t: t.pop("midlayer.mlp.up_proj.weight"))
    _bad(tmp_path, ckpt, tiny_target, "lacks midlayer.mlp.up_proj.weight")


def test_unexpected_tensor(tmp_path, references, tiny_target):
    ckpt = _rewrite(_edit(tmp_path, references["safeailab"]),
                    lambda t: t.update({"midlayer.extra.weight": np.zeros(3, np.float32)}))
    _bad(tmp_path, ckpt, tiny_target, "does not know", "midlayer.extra.weight")


def test_shapes_that_do_not_fit_the_target(tmp_path, references, tiny_dir):
    from tests.tiny_models import write_tiny_target

    wide = write_tiny_target(tiny_dir / "wide96.gguf", seed=7, hidden=96, heads=4, kv_heads=2, n_layer=12)
    ckpt = _edit(tmp_path, references["safeailab"], target_hidden_size=None)
    _bad(tmp_path, ckpt, wide, "shape")


def test_layer_ids_outside_the_target(tmp_path, references, tiny_target):
    ckpt = _edit(tmp_path, references["safeailab"], eagle_aux_hidden_state_layer_ids=[2, 4, 20])
    _bad(tmp_path, ckpt, tiny_target, "outside", "8 layers")


def test_layer_id_0_runs_and_the_final_hidden_state_is_refused_with_its_reason(tmp_path, references, tiny_target,
                                                                              qwen2_target):
    """speculators allows aux ids 0..N. 0 (the token embeddings) is the input of layer 0, which
    llama.cpp's layer-input API gives; N (the final hidden state) is no layer's input."""
    model = references["safeailab"]
    model.cfg.target_layers = (0, 3, 5)
    try:
        ckpt = _edit(tmp_path, model, eagle_aux_hidden_state_layer_ids=[0, 3, 5])
        out = tmp_path / "zero.gguf"
        assert convert(ckpt, tiny_target, out, outtype="f32", **quiet).config.target_layers == (0, 3, 5)
        c = verify_drafter(out, tiny_target, model)
        assert c.relative_error <= TOLERANCE["f32"] and c.top1_agreement == 1.0
        with EdgeEagle(tiny_target, out, k=3) as ee:
            plain = ee.generate("Once upon a time", max_tokens=20, speculative=False).result().tokens
            assert ee.generate("Once upon a time", max_tokens=20).result().tokens == plain
    finally:
        model.cfg.target_layers = (2, 3, 5)
    last = _edit(tmp_path / "n", references["safeailab"], eagle_aux_hidden_state_layer_ids=[2, 4, 8])
    _bad(tmp_path, last, tiny_target, "final hidden state", "below 8")
    _bad(tmp_path, ckpt, qwen2_target, "layer 0", "eval-callback")


@pytest.mark.parametrize("problem", ["range", "duplicate"])
def test_bad_d2t(problem, tmp_path, references, tiny_target):
    def change(t):
        if problem == "range":
            t["d2t"][-1] = 10**7
        else:
            t["d2t"][1] = t["d2t"][0] - 1  # draft 1 -> the same target id as draft 0
    ckpt = _rewrite(_edit(tmp_path, references["safeailab"]), change)
    _bad(tmp_path, ckpt, tiny_target, "d2t")


def test_truncated_safetensors(tmp_path, references, tiny_target):
    ckpt = _edit(tmp_path, references["safeailab"])
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    _bad(tmp_path, ckpt, tiny_target, "model.safetensors")


def test_truncated_or_non_gguf_target(tmp_path, checkpoints, tiny_target):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_target.read_bytes()[:100_000])
    _bad(tmp_path, checkpoints["safeailab"], cut, "cut.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a model")
    _bad(tmp_path, checkpoints["safeailab"], junk, "not a GGUF")


def test_drafter_given_as_target(tmp_path, checkpoints, tiny_drafters):
    _bad(tmp_path, checkpoints["safeailab"], tiny_drafters["eagle3"][0], "not a target")


def test_offline_hub_id_not_cached(tmp_path, tiny_target, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    _bad(tmp_path, Path("nobody/no-such-drafter"), tiny_target, "HF_HUB_OFFLINE")


def _offline_hub_cache(tmp_path: Path, checkpoint: Path, monkeypatch) -> str:
    """A Hugging Face cache holding `checkpoint` as someone/tiny-eagle3 at one commit (main),
    HF_HUB_OFFLINE set; returns the commit."""
    import shutil

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--someone--tiny-eagle3"
    shutil.copytree(checkpoint, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return commit


def test_hub_repo_id_from_the_local_cache_with_revision(tmp_path, checkpoints, references, tiny_target,
                                                        monkeypatch):
    """HF_HUB_OFFLINE=1: a repo id resolves from the local cache, pinned by --revision."""
    commit = _offline_hub_cache(tmp_path, checkpoints["specforge"], monkeypatch)
    for revision in (None, commit):
        out = tmp_path / f"hub-{revision}.gguf"
        convert("someone/tiny-eagle3", tiny_target, out, revision=revision, outtype="f32", **quiet)
        g = read_gguf(out)
        assert g.meta["edge_eagle.source"] == "someone/tiny-eagle3"
        assert g.meta.get("edge_eagle.revision") == revision
        assert verify_drafter(out, tiny_target, references["specforge"]).top1_agreement == 1.0


def test_output_file_has_ordinary_permissions(checkpoints, tiny_target, tmp_path):
    out = tmp_path / "perm.gguf"
    convert(checkpoints["safeailab"], tiny_target, out, outtype="f16", **quiet)
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_index_names_stay_inside_the_checkpoint_but_cache_links_are_fine(tmp_path, references, tiny_target):
    """A shard index may not name files outside its directory ('..', absolute, drive paths);
    a Hugging Face cache snapshot, whose files are links into ../../blobs, still loads."""
    import os

    ckpt = write_checkpoint(tmp_path / "sharded", "specforge", references["specforge"], weights="sharded")
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    # the cache layout: blobs/<hash> with snapshot links to them
    snap, blobs = tmp_path / "cache" / "snapshots" / "abc", tmp_path / "cache" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in ckpt.iterdir():
        (blobs / f.name).write_bytes(f.read_bytes())
        os.symlink(os.path.relpath(blobs / f.name, snap), snap / f.name)
    convert(snap, tiny_target, tmp_path / "ok.gguf", outtype="f32", **quiet)
    for evil in ("../escape.safetensors", "/etc/passwd", "C:\\\\x.safetensors", "..\\\\..\\\\x.safetensors"):
        first = next(iter(index["weight_map"]))
        bad = dict(index, weight_map=dict(index["weight_map"], **{first: evil}))
        index_path.write_text(json.dumps(bad))
        with pytest.raises(EdgeEagleError, match="outside its directory"):
            convert(ckpt, tiny_target, tmp_path / "bad.gguf", outtype="f32", **quiet)


def test_unknown_revision_in_the_offline_cache_is_a_clear_error(tmp_path, checkpoints, tiny_target, monkeypatch):
    _offline_hub_cache(tmp_path, checkpoints["specforge"], monkeypatch)
    with pytest.raises(EdgeEagleError, match="HF_HUB_OFFLINE|revision"):
        convert("someone/tiny-eagle3", tiny_target, tmp_path / "x.gguf", revision="f" * 40, **quiet)


def test_every_layout_round_trips_the_tensor_table():
    """One table names the drafter's tensors; each layout's reader (rename) inverts its writer
    (to_layout), for every tensor the table knows."""
    from edge_eagle.converters.layouts import BY_NAME, LAYOUTS, detect, rename, to_layout

    from edge_eagle.tensors import BY_REF, REQUIRED

    for layout in LAYOUTS:
        for name in [*BY_REF, "t2d"]:
            assert rename(layout, to_layout(layout, name)) == name, (layout.name, name)
    speculators = BY_NAME["speculators"]
    published = {to_layout(speculators, n) for n in REQUIRED}  # as the trainer writes it
    assert detect(published, {}) is speculators


@pytest.mark.parametrize("value", [True, False])
def test_specforge_norm_output_is_never_guessed(value, references, tiny_target, tmp_path):
    """SpecForge's norm_output changed meaning in its PR #879 and its checkpoints carry no version:
    an explicit value is refused until --norm-output says how to read it; absent, it is EAGLE-3."""
    ckpt = write_checkpoint(tmp_path / "sf", "specforge", references["specforge"],
                            config_overrides={"norm_output": value})
    with pytest.raises(EdgeEagleError, match="PR #879.*--norm-output head-only"):
        convert(ckpt, tiny_target, tmp_path / "x.gguf", outtype="f32", **quiet)
    for reading, fed_back in (("head-only", False), ("feedback", True)):
        report = convert(ckpt, tiny_target, tmp_path / f"{reading}.gguf", outtype="f32", norm_output=reading, **quiet)
        assert report.config.norm_output is fed_back
        assert any("--norm-output" in a for a in report.assumptions)
    plain = write_checkpoint(tmp_path / "sf-default", "specforge", references["specforge"])
    report = convert(plain, tiny_target, tmp_path / "d.gguf", outtype="f32", **quiet)
    assert report.config.norm_output is False
    assert any("every version" in a for a in report.assumptions)
    proc = cli("convert", str(ckpt), "--target", str(tiny_target), "-o", str(tmp_path / "c.gguf"))
    assert_clean_error(proc, "PR #879", "--norm-output")
