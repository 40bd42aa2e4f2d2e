"""Request bodies of the OpenAI endpoints, validated by pydantic. Unknown fields are ignored,
as OpenAI-compatible servers do, so clients that send more than we use keep working. An explicit
`null` means the field is absent (the OpenAI API allows it; its Python SDK sends it). Fields that
change the output and are not implemented (echo, suffix, best_of, the legacy functions) are
refused with a 400 that says so, unless they carry their default value: a request is never
answered as if they were absent. response_format, grammar, tools and tool_choice are read by
tools.chat_plan(), as the library's create_chat_completion() reads them."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: the call it answers

    def for_template(self) -> dict[str, Any]:
        """The message as tools.chat_plan() takes it."""
        return {**self.model_dump(exclude_none=True, exclude={"content"}), "content": self.text()}

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


#: fields not implemented, and the value each may carry (its default, meaning "off")
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "best_of": (1, "best_of is not implemented (one completion per request)"),
    "echo": (False, "echo is not implemented"),
    "suffix": ("", "suffix (insertion) is not implemented"),
    "functions": ([], "the legacy functions are not implemented; send them as tools"),
}


class Sampling(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)  # 0 keeps the most probable token only
    top_k: int = Field(0, ge=0)  # extension (llama.cpp, vLLM)
    seed: int | None = None  # negative (llama.cpp front ends send -1): random
    stop: Union[str, list[str], None] = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None  # text, json_object or json_schema (tools.py)
    grammar: str | None = None  # extension (llama-server): GBNF the output follows
    # chat: logprobs true and top_logprobs n; completions: logprobs n (the target's log-probabilities)
    logprobs: Union[bool, int, None] = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    logit_bias: dict[int, float] | None = None  # OpenAI's: token id (a JSON string key) -> -100..100
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)  # OpenAI's ranges
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repeat_penalty: float = Field(1.0, gt=0.0)  # extension (llama.cpp): 1 is off

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[int, float] | None) -> dict[int, float] | None:
        if v and any(not -100 <= b <= 100 for b in v.values()):
            raise ValueError("logit_bias values must be between -100 and 100")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: bool | int | None) -> bool | int | None:
        if v is not None and not isinstance(v, bool) and not 0 <= v <= 20:
            raise ValueError("logprobs must be true/false, or a number of top tokens from 0 to 20")
        return v

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> "Sampling":
        if self.top_logprobs and self.logprobs in (None, False):
            raise ValueError("top_logprobs: it needs logprobs: true")
        return self

    def logprobs_n(self) -> int | None:
        """generate()'s logprobs: None (none wanted), or how many top tokens to list."""
        if self.logprobs is None or self.logprobs is False:
            return None
        if self.logprobs is True:
            return self.top_logprobs or 0
        return int(self.logprobs)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None}
        for name, (off, why) in UNSUPPORTED.items():
            value = data.get(name, off)
            if value not in (off, None) and not (off == [] and value == []):
                raise ValueError(f"{name}: {why}")
        return data

    @field_validator("seed")
    @classmethod
    def _random_seed(cls, v: int | None) -> int | None:
        return None if v is not None and v < 0 else v

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None  # accepted; a forced call is one call


class CompletionRequest(Sampling):
    prompt: Union[str, list[str]]

    @model_validator(mode="before")
    @classmethod
    def _no_tools(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in ("tools", "tool_choice"):
                if data.get(name) not in (None, [], "none", "auto"):
                    raise ValueError(f"{name}: tool calls are for /v1/chat/completions; send them there")
        return data

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("give one prompt (a string, or a list of exactly one string)")
        return v

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]
