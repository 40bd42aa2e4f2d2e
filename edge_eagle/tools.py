"""Chat requests as the OpenAI API and llama-cpp-python shape them: structured output
(`response_format`) and tool calls, turned into a prompt, a grammar and a way to read the answer.
The library's create_chat_completion() (compat.py) and the server's /v1/chat/completions both
go through chat_plan(), so they mean the same thing by every field.

Tool calls need a chat template that renders `tools`. The template decides the call format the
model was trained on:
- "hermes" (Hermes, Qwen 2.5/3 and most templates): <tool_call>{"name": ..., "arguments": {...}}</tool_call>;
- "llama3" (Llama 3.1/3.2, whose template speaks of "parameters"): {"name": ..., "parameters": {...}}.
With tool_choice "auto" the model writes freely and a call it writes is parsed; "required" or a
named function constrains the output with a grammar to one call of that format whose arguments
follow the function's JSON schema; "none" renders no tools."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .errors import EdgeEagleError, RequestFieldError
from .grammar import json_object_grammar, json_schema_grammar

if TYPE_CHECKING:
    from .api import EdgeEagle

HERMES, LLAMA3 = "hermes", "llama3"
PYTHON_TAG = "<|python_tag|>"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def response_grammar(response_format: Mapping[str, Any] | None) -> str | None:
    """The grammar `response_format` asks for: None for text; any JSON object for
    {"type": "json_object"} (with llama-cpp-python's optional "schema", that schema); the
    schema's grammar for OpenAI's {"type": "json_schema", "json_schema": {"schema": ...}}."""
    if not response_format:
        return None
    if not isinstance(response_format, Mapping):
        raise RequestFieldError('response_format must be an object such as {"type": "json_object"}.',
                                "response_format")
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return json_object_grammar() if schema is None else _schema_grammar(schema)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise RequestFieldError('response_format json_schema needs {"json_schema": {"name": ..., '
                                    '"schema": {...}}}.', "response_format")
        return _schema_grammar(spec["schema"])
    raise RequestFieldError(f"response_format type {kind!r} is not known; use text, json_object or json_schema.",
                            "response_format")


def _schema_grammar(schema: Any) -> str:
    try:
        return json_schema_grammar(schema)
    except EdgeEagleError as exc:
        raise RequestFieldError(str(exc), "response_format") from None


def grammar_for(response_format: Mapping[str, Any] | None, grammar: str | None) -> str | None:
    """The grammar of a request that may give response_format or a grammar, not both."""
    structured = response_grammar(response_format)
    if structured is not None and grammar:
        raise RequestFieldError("Give either response_format or a grammar, not both.", "grammar")
    return grammar or structured


def template_style(template: str | None) -> str | None:
    """The tool-call format a chat template renders, or None when it has no tools."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or '"parameters"' in template or "ipython" in template:
        return LLAMA3
    return HERMES


def _functions(tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        kind = tool.get("type", "function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or kind != "function":
            raise RequestFieldError('Each tool must be {"type": "function", "function": {"name": ..., '
                                    '"parameters": {...}}}.', "tools")
        out.append(fn)
    return out


def call_grammar(tools: Sequence[Mapping[str, Any]], style: str, name: str | None = None) -> str:
    """A grammar for exactly one call in `style` to one of `tools` (or to `name`), its arguments
    following the function's parameter schema."""
    fns = [f for f in _functions(tools) if name is None or f["name"] == name]
    if not fns:
        raise RequestFieldError(f"tool_choice names the function {name!r}, which is not among the tools.",
                                "tool_choice")
    key = "parameters" if style == LLAMA3 else "arguments"
    options = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                 key: f.get("parameters") or {"type": "object"}},
                "required": ["name", key]} for f in fns]
    call = json_schema_grammar(options[0] if len(options) == 1 else {"anyOf": options})
    call = re.sub(r"(?m)^root ::=", "call ::=", call)
    if style == HERMES:
        return call + '\nroot ::= "<tool_call>" "\\n"? call "\\n"? "</tool_call>"\n'
    return call + "\nroot ::= call\n"


def _new_call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": {"name": name, "arguments": args}}


def parse_calls(text: str, style: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(the text outside the calls or None, the OpenAI tool_calls) of a model's answer. Text
    that does not parse as a call stays text."""
    calls: list[dict[str, Any]] = []
    if style == HERMES:
        rest = text
        for m in _HERMES_CALL.finditer(text):
            try:
                obj = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                calls.append(_new_call(obj["name"], obj.get("arguments", obj.get("parameters", {}))))
                rest = rest.replace(m.group(0), "", 1)
        content = rest.strip() if calls else text
    else:
        body = text.strip().removeprefix(PYTHON_TAG).strip()
        for part in (p for p in body.split(";") if p.strip()) if body.startswith("{") else ():
            try:
                obj = json.loads(part)
            except json.JSONDecodeError:
                calls = []
                break
            if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
                calls = []
                break
            calls.append(_new_call(obj["name"], obj.get("parameters", obj.get("arguments", {}))))
        content = "" if calls else text
    return (content or None) if calls else text, calls


@dataclass
class ChatPlan:
    """A chat request ready to run: its prompt, the grammar its output follows, and how to read
    tool calls out of the answer (style None: the answer is text)."""

    prompt: list[int]
    grammar: str | None = None
    style: str | None = None

    def finish(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls) of the full answer."""
        if self.style is None:
            return text, []
        return parse_calls(text, self.style)

    def stream(self) -> "ToolStream":
        return ToolStream(self.style)


def _message_for_template(m: Mapping[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: text content, and tool calls whose arguments are
    objects (templates write them with tojson), as llama.cpp hands them over."""
    out = {k: v for k, v in m.items() if v is not None}
    out["content"] = text_content(m.get("content"))
    if m.get("role") == "developer":
        out["role"] = "system"
    calls = []
    for call in m.get("tool_calls") or ():
        call = dict(call)
        fn = dict(call.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except json.JSONDecodeError:
                pass
        call["function"] = fn
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    return out


def text_content(content: Any) -> str:
    """A message's content as text: a string, None, or OpenAI's list of {"type": "text"} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))


def chat_plan(engine: "EdgeEagle", messages: Sequence[Mapping[str, Any]], *,
              tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
              response_format: Mapping[str, Any] | None = None, grammar: str | None = None) -> ChatPlan:
    """The prompt, grammar and tool-call reading of a chat request (module doc); EdgeEagleError
    for a request that cannot run, with what to change."""
    msgs = [_message_for_template(m) for m in messages]
    grammar = grammar_for(response_format, grammar)
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    if not tools or choice == "none":
        if isinstance(choice, Mapping) or choice == "required":
            raise RequestFieldError("tool_choice asks for a tool call but the request has no tools.", "tool_choice")
        return ChatPlan(engine.target.tokenize(engine.apply_chat_template(msgs), add_special=False), grammar)
    _functions(tools)
    style = template_style(engine.target.chat_template)
    if style is None:
        raise RequestFieldError("This model's chat template has no tool support; send the request without tools, "
                                "or load a model whose template renders them.", "tools")
    name = None
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise RequestFieldError('A named tool_choice is {"type": "function", "function": {"name": ...}}.',
                                    "tool_choice")
    elif choice not in ("auto", "required"):
        raise RequestFieldError(f"tool_choice {choice!r} is not known; use none, auto, required or a named "
                                "function.", "tool_choice")
    forced = name is not None or choice == "required"
    if forced and grammar:
        raise RequestFieldError("A forced tool call cannot also follow response_format or a grammar; drop one.",
                                "tool_choice")
    if forced:
        grammar = call_grammar(tools, style, name)
    text = engine.apply_chat_template(msgs, tools=list(tools))
    return ChatPlan(engine.target.tokenize(text, add_special=False), grammar, style)


@dataclass
class ToolStream:
    """Streams an answer's text while holding back what may be a tool call: from the first
    character that could open one (hermes: "<tool_call>" anywhere; llama3: "{" or
    "<|python_tag|>" first), text waits for finish(), which parses it."""

    style: str | None
    sent: str = ""
    held: str = ""
    holding: bool = False  # a call may have begun: everything from there waits
    plain: bool = False  # llama3: the answer began as text, so it holds no call

    def feed(self, piece: str) -> str:
        """The text that can go out now."""
        if self.style is None:
            return piece
        self.held += piece
        if self.holding:
            return ""
        if self.style == LLAMA3:  # a call is the whole answer: decide at its first characters
            if self.plain:
                return self._release(len(self.held))
            lead = self.held.lstrip()
            if not lead or (PYTHON_TAG.startswith(lead) and lead != PYTHON_TAG):
                return ""  # not decided yet
            if lead.startswith(("{", PYTHON_TAG)):
                self.holding = True
                return ""
            self.plain = True
            return self._release(len(self.held))
        at = self.held.find("<tool_call>")
        if at >= 0:
            self.holding = True
            return self._release(at)
        return self._release(len(self.held) - _partial(self.held, "<tool_call>"))

    def _release(self, n: int) -> str:
        out, self.held = self.held[:n], self.held[n:]
        self.sent += out
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(text still to send, tool calls) at the end of the answer."""
        if self.style is None or not self.held:
            return self._release(len(self.held)), []
        content, calls = parse_calls(self.held, self.style)
        if not calls:
            return self._release(len(self.held)), []
        self.held = ""
        return content or "", calls


def _partial(text: str, token: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of token."""
    for n in range(min(len(token) - 1, len(text)), 0, -1):
        if text.endswith(token[:n]):
            return n
    return 0
