"""The server's response builders (edge_eagle.server.responses), fed a hand-built SpecStats."""

from __future__ import annotations

import pytest

from edge_eagle.server import responses as R
from edge_eagle.stats import SpecStats


def _stats() -> SpecStats:
    s = SpecStats()
    s.record_step(3, 2)
    s.record_step(3, 0)
    s.record_step(0, 0)
    s.generated, s.prompt_tokens, s.prompt_cached = 5, 10, 4
    s.t_prefill, s.t_total = 0.0123456789, 0.5
    return s


CHAT = R.Envelope("chat", "chatcmpl-1", 1700000000, "tiny")
TEXT = R.Envelope("text", "cmpl-1", 1700000000, "tiny")


def test_edge_eagle_object_carries_the_acceptance_figures_of_to_dict():
    s = _stats()
    assert R.edge_eagle_stats(s.to_dict(), "eagle3", 3, flash_attn="off") == {
        "drafter": "eagle3", "drafter_version": 0, "flash_attn": "off", "k": 3, "k_mean": 2.0, "tau": 1.6667,
        "drafted": 6, "accepted": 2,
        "verify_steps": 3, "acceptance_rate": 0.3333, "per_position_acceptance": [0.5, 0.5, 0.0],
        "tokens_per_second": 10.0, "prompt_cached_tokens": 4, "prompt_prefilled_tokens": 6}


def test_timings_are_llama_servers_with_the_draft_counts():
    s = _stats()
    t = R.timings(s.to_dict(), 7)
    assert t["draft_n"] == s.drafted and t["draft_n_accepted"] == s.accepted
    assert t == {"prompt_n": 6, "cache_n": 4, "prompt_ms": 12.346, "predicted_n": 7, "predicted_ms": 500.0,
                 "predicted_per_second": 10.0, "draft_n": 6, "draft_n_accepted": 2}


def test_timings_keep_milliseconds_to_three_decimals():
    s = _stats()
    s.t_prefill, s.t_total = 0.0004321234, 1.2345678
    t = R.timings(s.to_dict(), 1)
    assert (t["prompt_ms"], t["predicted_ms"]) == (0.432, 1234.568)


def test_usage_counts_the_completion_given_not_the_tokens_generated():
    """A stop string can drop generated tokens from the reply; usage counts the reply's."""
    u = R.usage(_stats().to_dict(), 3)
    assert u == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                 "prompt_tokens_details": {"cached_tokens": 4}}


def test_report_has_usage_edge_eagle_and_timings_from_the_same_stats():
    d = _stats().to_dict()
    assert R.report(d, 5, "ngram", "auto") == {
        "usage": R.usage(d, 5), "edge_eagle": R.edge_eagle_stats(d, "ngram", "auto"), "timings": R.timings(d, 5)}


def test_a_generation_that_never_started_reports_only_the_prompt():
    assert R.unstarted_report(9) == {"usage": {"prompt_tokens": 9, "completion_tokens": 0, "total_tokens": 9},
                                     "edge_eagle": {}, "timings": {}}


@pytest.mark.parametrize("reason,want", [("length", "length"), ("context", "length"), ("stop", "stop"),
                                         ("cancelled", "stop"), (None, "stop")])
def test_finish_reason_maps_a_full_context_to_length(reason, want):
    assert R.finish_reason(reason) == want


def test_chat_completion_puts_the_text_in_an_assistant_message_then_the_figures():
    figures = R.report(_stats().to_dict(), 5, "eagle3", 3)
    body = R.completion(CHAT, "Hello", "stop", figures)
    assert body == {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "tiny",
                    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                 "message": {"role": "assistant", "content": "Hello"}}], **figures}


def test_text_completion_puts_the_text_in_the_choice():
    body = R.completion(TEXT, "Hello", "length", R.unstarted_report(2))
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"index": 0, "finish_reason": "length", "logprobs": None, "text": "Hello"}]


def test_a_chat_stream_opens_with_the_assistant_role():
    assert R.role_chunk(CHAT) == {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
                                  "model": "tiny", "choices": [{"index": 0, "finish_reason": None, "logprobs": None,
                                                                "delta": {"role": "assistant", "content": ""}}]}


def test_token_chunks_carry_a_delta_for_chat_and_text_for_completions_with_the_origin():
    chat, text = R.token_chunk(CHAT, "sea", "draft"), R.token_chunk(TEXT, "sea", "target")
    assert chat["object"] == "chat.completion.chunk" and text["object"] == "text_completion"
    assert chat["choices"] == [{"index": 0, "finish_reason": None, "logprobs": None, "delta": {"content": "sea"}}]
    assert text["choices"] == [{"index": 0, "finish_reason": None, "logprobs": None, "text": "sea"}]
    assert (chat["edge_eagle"], text["edge_eagle"]) == ({"origin": "draft"}, {"origin": "target"})


def test_the_final_chunk_has_no_text_and_carries_the_finish_reason_and_figures_but_not_usage():
    figures = R.report(_stats().to_dict(), 5, "eagle3", 3)
    chat, text = R.final_chunk(CHAT, "length", figures), R.final_chunk(TEXT, "length", figures)
    assert chat["choices"] == [{"index": 0, "finish_reason": "length", "logprobs": None, "delta": {}}]
    assert text["choices"] == [{"index": 0, "finish_reason": "length", "logprobs": None, "text": ""}]
    for chunk in (chat, text):
        assert chunk["edge_eagle"] == figures["edge_eagle"] and chunk["timings"] == figures["timings"]
        assert "usage" not in chunk


def test_the_usage_chunk_has_no_choices():
    figures = R.report(_stats().to_dict(), 5, "eagle3", 3)
    assert R.usage_chunk(TEXT, figures) == {"id": "cmpl-1", "object": "text_completion", "created": 1700000000,
                                            "model": "tiny", "choices": [], "usage": figures["usage"]}


def test_error_body_is_openai_shaped():
    assert R.error_body("Busy.", "server_error", code="overloaded") == {
        "error": {"message": "Busy.", "type": "server_error", "param": None, "code": "overloaded"}}


@pytest.mark.parametrize("kind,prefix", [("chat", "chatcmpl-"), ("text", "cmpl-")])
def test_new_envelopes_get_a_fresh_id_with_the_kinds_prefix(kind, prefix):
    a, b = R.Envelope.new(kind, "tiny"), R.Envelope.new(kind, "tiny")
    assert a.id.startswith(prefix) and len(a.id) == len(prefix) + 24 and a.id != b.id
