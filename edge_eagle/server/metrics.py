"""Prometheus counters, named after vLLM's speculative-decoding metrics (vllm:spec_decode_*),
under the edge_eagle: prefix, plus request and token counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from ..stats import SpecStats


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.num_drafts = Counter("edge_eagle:spec_decode_num_drafts", "Verify steps that checked at least one draft",
                                  registry=r)
        self.num_draft_tokens = Counter("edge_eagle:spec_decode_num_draft_tokens", "Draft tokens proposed",
                                        registry=r)
        self.num_accepted_tokens = Counter("edge_eagle:spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                           registry=r)
        self.accepted_per_pos = Counter("edge_eagle:spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted, by draft position (0-based)", ["position"],
                                        registry=r)
        self.drafted_per_pos = Counter("edge_eagle:spec_decode_num_draft_tokens_per_pos",
                                       "Draft tokens proposed, by draft position (0-based)", ["position"], registry=r)
        self.requests = Counter("edge_eagle:requests", "HTTP requests to the API endpoints", ["endpoint", "status"],
                                registry=r)
        self.request_success = Counter("edge_eagle:request_success", "Finished generations", ["finished_reason"],
                                       registry=r)
        self.prompt_tokens = Counter("edge_eagle:prompt_tokens", "Prompt tokens of finished generations", registry=r)
        self.prompt_tokens_cached = Counter("edge_eagle:prompt_tokens_cached",
                                            "Prompt tokens reused from the KV cache (not prefilled)", registry=r)
        self.generation_tokens = Counter("edge_eagle:generation_tokens", "Generated tokens", registry=r)
        self.running = Gauge("edge_eagle:num_requests_running", "Generations running", registry=r)
        self.waiting = Gauge("edge_eagle:num_requests_waiting", "Generations queued", registry=r)
        self.drafter_version = Gauge("edge_eagle:drafter_version",
                                     "The adapted drafter version in use (0: as given; --learn)", registry=r)

    def record(self, stats: SpecStats, completion_tokens: int, finish_reason: str) -> None:
        self.num_drafts.inc(stats.draft_steps)
        self.num_draft_tokens.inc(stats.drafted)
        self.num_accepted_tokens.inc(stats.accepted)
        for i, (d, a) in enumerate(zip(stats.drafted_at, stats.accepted_at)):
            self.drafted_per_pos.labels(str(i)).inc(d)
            self.accepted_per_pos.labels(str(i)).inc(a)
        self.request_success.labels(finish_reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.prompt_tokens_cached.inc(stats.prompt_cached)
        self.generation_tokens.inc(completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
