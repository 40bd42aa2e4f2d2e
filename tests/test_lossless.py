"""Greedy speculative output equals plain greedy decoding of the same target.

Batched verification runs different matmul kernels than one-token decoding, so a token
may legitimately flip where the target's top two logits are tied to within float noise.
`assert_lossless` accepts a divergence only if it is such a tie: at the first differing
position the speculative token is the runner-up of plain decoding (replayed token by
token), and the top-2 gap is below TIE_GAP or below twice the model's own batch-shape noise
on that gap there (the largest change of the gap when the same context is decoded in
chunks of 2, 4, 8 or 16 tokens, or in one prefill). Anything else is a
logic error and fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge_eagle import EdgeEagle, NgramDrafter
from edge_eagle.errors import ContextOverflowError
from edge_eagle.target import Target
from tests.drafters import OracleDrafter

TIE_GAP = 0.05  # logits; batched vs single-token kernels differ by ~1e-3 here


def assert_lossless(target: Target, prompt: list[int], plain: list[int], spec: list[int]) -> None:
    if spec == plain:
        return
    i = next((j for j, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
    assert i < min(len(plain), len(spec)), f"lengths differ without a token difference: {len(plain)} vs {len(spec)}"
    target.memory.clear()
    target.set_capture(())
    # replay plain decoding itself (prefill, then one token at a time): a one-shot prefill of
    # prompt + plain[:i] has other batch shapes, which move SmolLM2's logits near a tie too
    logits = target.prefill(prompt).logits[-1]
    for j, tok in enumerate(plain[:i]):
        logits = target.decode([tok], len(prompt) + j).logits[-1]
    logits = logits.astype(np.float64)
    top2 = np.argsort(-logits)[:2]
    gap = logits[top2[0]] - logits[top2[1]]
    assert plain[i] == top2[0], "plain decoding is not greedy?"
    # the model's own numerical noise on this gap, here: the same context decoded in chunks of
    # 2, 4, 8 and 16 tokens (verify batches), in one prefill, and (with tree verification)
    # through trees whose accepted path runs through second candidates, which leaves the KV
    # cells out of position order (llama.cpp's CPU flash attention then sums in another order)
    context = prompt + plain[:i]
    noise = 0.0
    for chunk in (2, 4, 8, 16, len(context)):
        target.memory.clear()
        for lo in range(0, len(context), chunk):
            other = target.decode(context[lo:lo + chunk], lo).logits[-1]
        noise = max(noise, _gap_change(other, top2, gap))
    if target.tree_paths >= 3:
        noise = max(noise, _gap_change(_replay_through_trees(target, prompt, plain[:i]), top2, gap))
    assert spec[i] == top2[1] and gap < max(TIE_GAP, 2 * noise), (
        f"token {i} differs ({plain[i]} vs {spec[i]}) with top-2 gap {gap:.4f} (batch-shape noise on it "
        f"{noise:.4f}): not a numerical tie")


def _gap_change(logits: np.ndarray, top2: np.ndarray, gap: float) -> float:
    other = logits.astype(np.float64)
    return abs((other[top2[0]] - other[top2[1]]) - gap)


def _replay_through_trees(target: Target, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The target's logits after prompt + tokens, reached by verifying trees [x, t1, y, t2]
    (x, y wrong siblings) that accept the true t1, t2 through each depth's 2nd candidate."""
    target.memory.clear()
    target.prefill(prompt[:-1])
    seq, rest = list(prompt), list(tokens)  # the KV holds seq[:-1]
    while len(rest) >= 3:
        t1, t2 = rest[0], rest[1]
        nodes = [(t1 + 1) % target.n_vocab, t1, (t2 + 1) % target.n_vocab, t2]
        target.decode_tree(seq[-1], nodes, [-1, -1, 1, 1], len(seq) - 1)
        target.keep_path([1, 3], len(seq) - 1, seq[-1], nodes)
        seq += rest[:3]
        rest = rest[3:]
    for j, tok in enumerate([seq[-1], *rest]):
        logits = target.decode([tok], len(seq) - 1 + j).logits[-1]
    return logits.copy()


def _run(ee: EdgeEagle, prompt: str, n: int, **kw) -> tuple[list[int], list[int]]:
    gen = ee.generate(prompt, max_tokens=n, **kw).result()
    return ee.target.tokenize(prompt), gen.tokens


PROMPTS = ["Once upon a time", "def fibonacci(n):", "The list of prime numbers: 2, 3, 5, 7"]


@pytest.mark.parametrize("variant", ["eagle3", "eagle3.1", "norm_before_residual"])
def test_tiny_eagle_is_lossless(variant, tiny_target, tiny_drafters):
    with EdgeEagle(tiny_target, tiny_drafters[variant][0], k=4) as ee:
        for prompt in PROMPTS:
            toks, plain = _run(ee, prompt, 48, speculative=False)
            _, spec = _run(ee, prompt, 48)
            assert ee.last_stats.drafted > 0
            assert_lossless(ee.target, toks, plain, spec)


@pytest.mark.parametrize("corrupt_every", [0, 3, 5])
def test_tiny_oracle_with_rejections_is_lossless(corrupt_every, tiny_target):
    """An oracle that lies every n-th draft exercises partial accepts and KV rollback."""
    with EdgeEagle(tiny_target, None, k=5) as ee:
        toks, plain = _run(ee, PROMPTS[0], 60)
        ee.drafter = OracleDrafter(toks + plain, corrupt_every=corrupt_every, vocab_size=ee.target.n_vocab)
        _, spec = _run(ee, PROMPTS[0], 60)
        assert_lossless(ee.target, toks, plain, spec)
        if corrupt_every:
            assert 0 < ee.last_stats.accepted < ee.last_stats.drafted


def test_oracle_drafts_are_all_accepted_and_stats_say_so(tiny_target):
    k, n = 4, 41  # 1 prefill token + 8 steps of k drafts + 1 bonus
    with EdgeEagle(tiny_target, None, k=k) as ee:
        toks, plain = _run(ee, PROMPTS[1], n)
        ee.drafter = OracleDrafter(toks + plain)
        gen = ee.generate(PROMPTS[1], max_tokens=n).result()
        s = gen.stats
        assert gen.tokens == plain
        assert s.drafted == s.accepted == 8 * k
        assert s.verify_steps == 8
        assert s.tau == pytest.approx(1 + k)
        assert s.per_position_acceptance == [1.0] * k
        assert s.acceptance_rate == 1.0
        assert sum(1 for t in _origins(ee, PROMPTS[1], n) if t == "draft") == 8 * k


def _origins(ee: EdgeEagle, prompt: str, n: int) -> list[str]:
    return [t.origin for t in ee.generate(prompt, max_tokens=n)]


def test_long_prompt_over_n_batch_is_lossless(tiny_target, tiny_drafters):
    prompt = " ".join(f"item{i}" for i in range(400))  # > 512 tokens: chunked prefill + encoder
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k=3, n_ctx=2048) as ee:
        toks, plain = _run(ee, prompt, 24, speculative=False)
        assert len(toks) > 512
        _, spec = _run(ee, prompt, 24)
        assert_lossless(ee.target, toks, plain, spec)


def test_flash_attention_follows_the_prompt_length_and_output_stays_lossless(tiny_target, tiny_drafters):
    """auto on the CPU: a prompt of FLASH_ATTN_OFF_FROM tokens makes the target's and drafter's
    contexts again without flash attention (the logits are a forced-off context's, bit for bit),
    a short one goes back; chains (the native fast path included) and trees stay lossless on
    the contexts made again, and the costs measured for a setting are kept for its return."""
    from edge_eagle.system import FLASH_ATTN_OFF_FROM

    long_prompt = " ".join(f"item{i}" for i in range(400))
    short_prompt = PROMPTS[1]
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k="auto", n_ctx=2048, tree_paths=8,
                   n_threads=2) as ee:  # forced threads: no governor, so the costs move only with the setting
        assert ee.target.flash_attn.routed and ee.target.flash_attn.setting == "llama.cpp"
        toks, plain = _run(ee, short_prompt, 24, speculative=False)
        _, spec = _run(ee, short_prompt, 24, k=3)
        assert_lossless(ee.target, toks, plain, spec)
        assert ee.attention_switches == 0
        _run(ee, short_prompt, 8)  # k="auto": costs measured (or cached) for llama.cpp's setting
        on_costs = {key: v for key, v in ee.calibration.items() if key != "source"}

        long_toks = ee.target.tokenize(long_prompt)
        assert len(long_toks) >= FLASH_ATTN_OFF_FROM
        _, long_plain = _run(ee, long_prompt, 24, speculative=False)
        assert ee.target.flash_attn.setting == "off" and ee.attention_switches == 1
        ee.target.memory.clear()
        routed = np.array(ee.target.prefill(long_toks).logits, copy=True)
        for variant in ({"k": 3}, {"tree": 5}, {}):
            _, spec = _run(ee, long_prompt, 24, **variant)
            assert ee.last_stats.drafted > 0, variant
            assert_lossless(ee.target, long_toks, long_plain, spec)
        assert ee.attention_switches == 1  # the same setting for every request of this length

        assert ee.route_attention(len(toks)) == "llama.cpp" and ee.attention_switches == 2
        assert ee.calibration["source"] == "kept"  # llama.cpp's setting's costs, not measured again
        assert {key: v for key, v in ee.calibration.items() if key != "source"} == on_costs
        _, again = _run(ee, short_prompt, 24, k=3)
        assert ee.attention_switches == 2
        assert_lossless(ee.target, toks, plain, again)

    # a chat whose prompt grows past the threshold: its cells move into the new contexts, V laid
    # out anew, so the turn reads only its new part and greedy output stays lossless
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k=3, n_ctx=2048, n_threads=2) as ee:
        grown = long_toks[:FLASH_ATTN_OFF_FROM + 40]
        first = grown[:200]
        assert ee.generate(first, max_tokens=8).result().flash_attn == "auto"
        cached = list(ee.target.memory.tokens)
        gen = ee.generate(grown, max_tokens=24).result()
        assert ee.target.flash_attn.setting == "off" and ee.attention_switches == 1 and gen.flash_attn == "off"
        assert gen.stats.prompt_cached == len(first) - 1 and gen.stats.drafted > 0  # a feature drafter: one more
        assert cached[:len(first)] == first
        assert_lossless(ee.target, grown, ee.generate(grown, max_tokens=24, speculative=False).result().tokens,
                        gen.tokens)

    off = Target(tiny_target, n_ctx=2048, flash_attn="off")
    on = Target(tiny_target, n_ctx=2048, flash_attn="on")
    try:
        np.testing.assert_array_equal(routed, off.prefill(long_toks).logits)
        assert not np.array_equal(routed, on.prefill(long_toks).logits)
    finally:
        off.close()
        on.close()


def test_kv_cells_move_bit_for_bit_when_flash_attention_switches(tiny_target, tiny_drafters):
    """A switch makes the target's and drafter's contexts again: sequence 0's cells move across
    with V transposed (kv.relayout_v) and back out bit for bit, the drafter's waiting rows stay,
    and its next drafts are the ones it would have made (to the kernels' rounding)."""
    from edge_eagle.eagle.drafter import EagleDrafter
    from edge_eagle.kv import relayout_v, seq_state
    from edge_eagle.system import decide_flash_attn

    auto = decide_flash_attn("auto", True)
    pairs = []
    for _ in range(2):
        t = Target(tiny_target, n_ctx=1024, tree_paths=8, flash_attn="auto")
        d = EagleDrafter(tiny_drafters["eagle3.1"][0], t)
        t.set_capture(d.target_layers)
        prompt = t.tokenize(" ".join(f"item{i}" for i in range(60)))
        res = t.prefill(prompt)
        d.ingest(res.require_features(), 0, prompt)
        seq = prompt + [int(np.argmax(res.logits[-1]))]
        d.propose(seq, 3)  # the drafter's rows go into its KV
        pairs.append((t, d))
    try:
        (t1, d1), (t2, d2) = pairs
        target_cells, drafter_cells = seq_state(t2.ctx), seq_state(d2.ctx)
        pending = (d2.pending.rows, d2.pending.pos0, d2.pending.kv_rows, list(d2.pending.kv_tokens))
        assert t2.set_flash_attn(auto.for_prompt(10_000))
        d2.rebind(t2)
        assert t2.flash_attn.setting == "off" and t2.memory.tokens == prompt
        assert relayout_v(seq_state(t2.ctx), v_trans=False) == target_cells != relayout_v(target_cells, True)
        assert relayout_v(seq_state(d2.ctx), v_trans=False) == drafter_cells
        for broken in (target_cells[:-3], target_cells + b"\0", b"not a state"):  # such cells do not move
            assert relayout_v(broken, True) is None
        assert (d2.pending.rows, d2.pending.pos0, d2.pending.kv_rows, list(d2.pending.kv_tokens)) == pending
        assert d2.pending.kv_rows > 0
        nxt = None
        logits = []
        for t, d in pairs:  # a plain step, then drafts, on each
            res = t.decode([seq[-1]], len(prompt))
            d.ingest(res.require_features(), len(prompt), [seq[-1]])
            nxt = int(np.argmax(res.logits[-1])) if nxt is None else nxt
            logits.append(d.propose_with_logits(seq + [nxt], 3)[1][0])
        np.testing.assert_allclose(logits[1], logits[0], atol=0.05)  # another attention kernel, same cells
    finally:
        for t, d in pairs:
            d.close()
            t.close()


@pytest.mark.smollm
def test_smollm_is_lossless(smollm, tmp_path):
    from tests.tiny_models import make_drafter

    drafter_path, _ = make_drafter(tmp_path / "d.gguf", smollm, seed=5, draft_vocab=4096, fc_norm=True,
                                   norm_output=True)
    msgs = [{"role": "user", "content": "List three colours of the rainbow, one per line."}]
    with EdgeEagle(smollm, NgramDrafter(), k=4, n_ctx=1024) as ee:
        prompt = ee.apply_chat_template(msgs)
        toks, plain = _run(ee, prompt, 64, speculative=False, add_special=False)
        _, spec = _run(ee, prompt, 64, add_special=False)
        assert_lossless(ee.target, toks, plain, spec)
        ee.drafter = OracleDrafter(toks + plain, corrupt_every=4, vocab_size=ee.target.n_vocab)
        _, spec = _run(ee, prompt, 64, add_special=False)
        assert_lossless(ee.target, toks, plain, spec)
        assert ee.last_stats.accepted > 0
    with EdgeEagle(smollm, drafter_path, k=4, n_ctx=1024) as ee:
        _, spec = _run(ee, prompt, 64, add_special=False)
        assert ee.last_stats.drafted > 0
        assert_lossless(ee.target, toks, plain, spec)


def test_qwen2_target_uses_the_callback_path_and_is_lossless(qwen2_target, qwen2_drafter):
    with EdgeEagle(qwen2_target, qwen2_drafter[0], k=4) as ee:
        assert ee.target.capture_path == "callback"
        toks, plain = _run(ee, PROMPTS[0], 40, speculative=False)
        _, spec = _run(ee, PROMPTS[0], 40)
        assert ee.last_stats.drafted > 0
        assert_lossless(ee.target, toks, plain, spec)


@pytest.mark.parametrize("k", [0, 3, "auto"])
def test_filling_the_context_stops_cleanly_and_leaves_a_usable_cache(tiny_target, tiny_drafters, k):
    """A generation that reaches n_ctx ends with finish_reason "context" (every position
    used, never past it); the next generation on the same engine equals a fresh engine's."""
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], n_ctx=96) as ee:
        prompt = ee.target.tokenize("Tell me a long story about the sea.")
        gen = ee.generate(prompt, max_tokens=500, k=k, speculative=k != 0).result()
        assert gen.finish_reason == "context"
        assert len(prompt) + gen.stats.generated == ee.target.n_ctx + 1  # the last token needs no slot
        after = ee.generate("Hello there", max_tokens=12, k=k, speculative=k != 0).result().tokens
    with EdgeEagle(tiny_target, None, n_ctx=96) as fresh:
        assert after == fresh.generate("Hello there", max_tokens=12).result().tokens


def test_chat_drops_the_oldest_turns_to_fit_and_stays_lossless(tiny_target, tiny_drafters):
    history = []
    for i in range(12):
        history += [{"role": "user", "content": f"Question {i}: tell me about topic number {i} please."},
                    {"role": "assistant", "content": f"Answer {i}: " + "words " * 12}]
    history.append({"role": "user", "content": "And finally, what about the sea?"})
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k=3, n_ctx=256) as ee:
        gen = ee.chat(history, max_tokens=32).result()
        assert gen.dropped_messages > 0 and gen.finish_reason in ("length", "stop")
        kept = history[gen.dropped_messages:]
        assert kept[-1] == history[-1]
        prompt = ee.apply_chat_template(kept)
        assert len(ee.target.tokenize(prompt, add_special=False)) + 32 <= 256
        plain = ee.generate(prompt, max_tokens=32, add_special=False, speculative=False).result()
        assert gen.tokens == plain.tokens
        with pytest.raises(ContextOverflowError):
            ee.chat(history, max_tokens=32, truncate=False)
