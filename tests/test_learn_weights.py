"""A drafter GGUF read back into the trainable torch reference: the weights it was written from
(to the precision it was written in), for every layout flag, and the same chain as llama.cpp."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from edge_eagle.checks.reference import reference_chain
from edge_eagle.learn.weights import read_drafter, reference_from_gguf
from tests.tiny_models import LAYOUT_FLAGS, make_drafter, reference_weights


@pytest.mark.parametrize("layout", ["eagle3.1", "speculators", "eagle3-v3", "nemo", "safeailab"])
def test_a_drafter_reads_back_as_the_weights_it_was_written_from(tiny_dir, tiny_target, layout):
    path, model = make_drafter(tiny_dir / f"readback-{layout}.gguf", tiny_target, seed=3, **LAYOUT_FLAGS[layout])
    cfg, weights = read_drafter(path, tiny_target)
    assert cfg.rms_norm_eps == pytest.approx(model.cfg.rms_norm_eps)  # stored as float32
    assert replace(cfg, rms_norm_eps=model.cfg.rms_norm_eps) == model.cfg
    written = reference_weights(model)
    assert sorted(weights) == sorted(k for k in written if k != "target_embed")
    for name, w in weights.items():
        np.testing.assert_allclose(w, written[name], rtol=0, atol=1e-6, err_msg=name)
    back = reference_from_gguf(path, tiny_target)
    feats = torch.randn(6, 3 * cfg.target_hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert reference_chain(back, feats, list(range(5, 12)), 4)[0] == reference_chain(model, feats,
                                                                                        list(range(5, 12)), 4)[0]


def test_a_quantised_drafter_reads_back_dequantised(tiny_dir, tiny_target):
    from edge_eagle.converters.gguf_out import write_eagle3

    from edge_eagle.gguf_file import read_gguf

    _, model = make_drafter(tiny_dir / "readback-f32.gguf", tiny_target, seed=4, fc_norm=True, norm_output=True)
    path = write_eagle3(tiny_dir / "readback-q8.gguf", reference_weights(model), model.cfg, read_gguf(tiny_target),
                        outtype="q8_0")
    _, weights = read_drafter(path, tiny_target)
    written = reference_weights(model)
    for name in ("fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight"):
        w, ref = weights[name], written[name]
        assert w.dtype == np.float32 and np.abs(w - ref).max() <= np.abs(ref).max() / 100  # q8_0's step
    assert np.array_equal(weights["d2t"], written["d2t"])
