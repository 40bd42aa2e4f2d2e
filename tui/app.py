"""`edge-eagle chat`: a terminal chat with live acceptance statistics.

A thin view over the library API (edge_eagle.EdgeEagle): generation runs in a worker
thread and reaches the UI as messages, so the interface never freezes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header, Input

from edge_eagle import EdgeEagle, EdgeEagleError, Generation
from edge_eagle.fsutil import atomic_write
from edge_eagle.options import EngineOptions
from edge_eagle.stats import SpecStats

from .widgets import ChatMessage, StatsPanel


@dataclass
class ChatOptions(EngineOptions):
    """The engine's options (k, tree and p_min are also the settings the keys change), and the
    chat's own."""

    temperature: float = 0.0
    max_tokens: int = 512


class EdgeEagleChat(App):
    TITLE = "edge-eagle chat"
    CSS = """
    #main { height: 1fr; }
    #chat { width: 1fr; }
    #transcript { height: 1fr; padding: 0 1; }
    #prompt { dock: bottom; }
    """
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("f8", "toggle_speculation", "Spec on/off"),
        Binding("f9", "toggle_tint", "Tint"),
        Binding("f2", "k(-1)", "k−"),
        Binding("f3", "k(1)", "k+"),
        Binding("f4", "temperature(-0.1)", "temp−"),
        Binding("f5", "temperature(0.1)", "temp+"),
        Binding("f6", "p_min(-0.1)", "p_min−"),
        Binding("f7", "p_min(0.1)", "p_min+"),
        Binding("f10", "tree", "Tree"),
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    @dataclass
    class Loaded(Message):
        engine: EdgeEagle | None
        error: str | None

    @dataclass
    class Tokens(Message):
        message: ChatMessage
        pieces: list[tuple[str, str]]
        stats: SpecStats  # a snapshot: the worker keeps counting into its own

    @dataclass
    class Finished(Message):
        message: ChatMessage
        stats: SpecStats | None
        reason: str | None
        error: str | None = None
        version: int = 0  # the adapted drafter version that drafted it (0: as given)

    def __init__(self, options: ChatOptions | None = None, engine: EdgeEagle | None = None,
                 save_dir: str | os.PathLike[str] = "."):
        super().__init__()
        self.options = options or ChatOptions()
        self.engine = engine
        self.save_dir = Path(save_dir)
        self.history: list[dict[str, str]] = []
        self.speculative = True
        self.tint = True
        self.generation: Generation | None = None
        self.busy = False  # a reply is being generated (set and cleared on the UI thread)
        self.speeds: list[float] = []
        self.by_version: dict[int, SpecStats] = {}  # --learn: this chat's figures per drafter version
        self._reports = 0  # background adaptations already announced

    # --- layout --------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield VerticalScroll(id="transcript")
                yield Input(placeholder="Loading the models…", id="prompt", disabled=True)
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self._show_settings()
        if self.engine is None:
            self.load_models()
        else:
            self.post_message(self.Loaded(self.engine, None))

    @work(thread=True, exclusive=True, group="load")
    def load_models(self) -> None:
        try:
            engine = EdgeEagle.from_options(self.options)
            engine.prepare_costs()  # batch costs now (or from the cache), not on the first message
            self.post_message(self.Loaded(engine, None))
        except EdgeEagleError as e:
            self.post_message(self.Loaded(None, str(e)))

    def on_edge_eagle_chat_loaded(self, event: Loaded) -> None:
        prompt = self.query_one("#prompt", Input)
        if event.error:
            self._append(ChatMessage("error", event.error))
            prompt.placeholder = "Could not load the models (see above); press ctrl+q to quit."
            return
        self.engine = event.engine
        prompt.disabled = False
        prompt.placeholder = "Ask something (Enter to send, Esc to stop)"
        prompt.focus()
        self._show_settings()
        store = self.engine.learn_store if self.engine is not None else None
        if store is not None:  # --learn: say what is kept and where
            if store.recovered:
                self.notify(store.recovered, severity="warning", timeout=15)
            self.notify(f"--learn: every finished reply and its prompt are kept as token ids in {store.path}",
                        timeout=10)
            self._show_learning()
            self.set_interval(1.0, self._watch_learning)

    # --- chatting ------------------------------------------------------------------------

    def _append(self, widget: ChatMessage) -> ChatMessage:
        transcript = self.query_one("#transcript", VerticalScroll)
        transcript.mount(widget)
        transcript.scroll_end(animate=False)
        return widget

    @on(Input.Submitted, "#prompt")
    def send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text or self.engine is None or self.busy:
            return
        self.busy = True
        event.input.value = ""
        self.history.append({"role": "user", "content": text})
        self._append(ChatMessage("user", text))
        reply = self._append(ChatMessage("assistant", tint=self.tint))
        self.generate(reply, list(self.history))

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, reply: ChatMessage, messages: list[dict[str, str]]) -> None:
        assert self.engine is not None
        o = self.options
        try:
            gen = self.engine.chat(messages, max_tokens=o.max_tokens, temperature=o.temperature, k=o.k,
                                   p_min=o.p_min, speculative=self.speculative, tree=o.tree or 0)
        except EdgeEagleError as e:
            self.post_message(self.Finished(reply, None, None, str(e)))
            return
        self.generation = gen
        pieces: list[tuple[str, str]] = []
        last = time.monotonic()
        try:
            for tok in gen:
                pieces.append((tok.text, tok.origin))
                if time.monotonic() - last > 0.05:  # batch UI updates to ~20 per second
                    self.post_message(self.Tokens(reply, pieces, gen.stats.snapshot()))
                    pieces, last = [], time.monotonic()
            if pieces:
                self.post_message(self.Tokens(reply, pieces, gen.stats.snapshot()))
            reason = gen.finish_reason or ""
            if gen.dropped_messages:
                reason += f" · {gen.dropped_messages} oldest messages left out to fit the context window"
            self.post_message(self.Finished(reply, gen.stats.snapshot(), reason, version=gen.drafter_version))
        except EdgeEagleError as e:
            self.post_message(self.Finished(reply, gen.stats.snapshot(), None, str(e), gen.drafter_version))
        finally:
            self.generation = None
            gen.close()  # however the worker ends (the app closing under it too), the engine is free again

    def on_edge_eagle_chat_tokens(self, event: Tokens) -> None:
        event.message.add(event.pieces)
        self.query_one(StatsPanel).show_message(event.stats)
        self.query_one("#transcript", VerticalScroll).scroll_end(animate=False)

    def on_edge_eagle_chat_finished(self, event: Finished) -> None:
        self.busy = False
        if event.error:
            self._append(ChatMessage("error", event.error))
        if event.message.text:
            self.history.append({"role": "assistant", "content": event.message.text})
        if event.stats is not None:
            s = event.stats
            self.speeds.append(s.tokens_per_second)
            mode = "speculative" if self.speculative else "plain"
            event.message.set_footer(f"{mode} · {s.generated} tokens · {s.tokens_per_second:.1f} tok/s"
                                     f" · tau {s.tau:.2f} · {event.reason}")
            self.query_one(StatsPanel).show_message(s)
            if self.speculative and s.generated:
                self.by_version.setdefault(event.version, SpecStats()).merge(s)
        if self.engine is not None:
            self.query_one(StatsPanel).show_session(self.engine.stats, self.speeds)
            self._show_learning()

    # --- learning (--learn) --------------------------------------------------------------------

    def _show_learning(self) -> None:
        if self.engine is None or self.engine.learn_store is None:
            return
        adapter = self.engine.adapter
        state = adapter.state if adapter is not None else \
            "by hand (edge-eagle learn adapt)" if self.engine.learn_base is not None else "needs an EAGLE drafter"
        self.query_one(StatsPanel).show_learning(self.engine.drafter_version, state,
                                                 adapter.reports[-1] if adapter is not None and adapter.reports
                                                 else None, self.by_version)

    def _watch_learning(self) -> None:
        """Each second: a finished background adaptation is announced, and the panel follows it."""
        adapter = self.engine.adapter if self.engine is not None else None
        if adapter is not None and len(adapter.reports) > self._reports:
            self._reports = len(adapter.reports)
            r = adapter.reports[-1]
            if r.get("accepted"):
                self.notify(f"Drafter version {r['version']} in use from the next reply: tau on your held-out "
                            f"requests {r['tau_before']:.2f} -> {r['tau_after']:.2f}.", timeout=10)
            else:
                self.notify(f"The drafter stays as it is: {r.get('reason', 'the candidate did not measure better')}.",
                            timeout=10)
        self._show_learning()

    # --- actions -------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.generation is not None:
            self.generation.cancel()

    def _show_settings(self) -> None:
        drafter = self.engine.drafter if self.engine is not None else None
        o = self.options
        self.query_one(StatsPanel).show_settings(self.speculative, drafter, o.k, o.temperature, o.p_min, o.tree)

    def action_toggle_speculation(self) -> None:
        self.speculative = not self.speculative
        self._show_settings()
        self.notify(f"Speculation {'on' if self.speculative else 'off'} from the next message.")

    def action_toggle_tint(self) -> None:
        self.tint = not self.tint
        for message in self.query(ChatMessage):
            message.tint = self.tint

    def action_k(self, delta: int) -> None:
        """auto sits below 0: f2 from 0 gives auto, f3 from auto gives 0."""
        k = self.options.k
        value = -1 if k == "auto" else int(k)
        value = max(-1, min(16, value + delta))
        self.options.k = "auto" if value < 0 else value
        self._show_settings()

    def action_tree(self) -> None:
        """Cycle chains -> trees of 7, 15 nodes -> chains (EAGLE drafters only)."""
        drafter = self.engine.drafter if self.engine is not None else None
        if drafter is None or not drafter.supports_trees:
            self.notify("Tree drafting needs an EAGLE drafter.")
            return
        order = [None, 7, 15]
        self.options.tree = order[(order.index(self.options.tree) + 1) % len(order)
                                  if self.options.tree in order else 0]
        self._show_settings()

    def action_temperature(self, delta: float) -> None:
        self.options.temperature = round(max(0.0, min(2.0, self.options.temperature + delta)), 2)
        self._show_settings()

    def action_p_min(self, delta: float) -> None:
        self.options.p_min = round(max(0.0, min(1.0, self.options.p_min + delta)), 2)
        self._show_settings()

    def action_save(self) -> None:
        if not self.history:
            self.notify("Nothing to save yet.")
            return
        path = self.save_dir / f"edge-eagle-chat-{time.strftime('%Y%m%d-%H%M%S')}.md"
        body = "\n\n".join(f"**{m['role']}**:\n\n{m['content']}" for m in self.history) + "\n"
        atomic_write(path, body)
        self.notify(f"Saved {path}")

    async def action_new_chat(self) -> None:
        if self.generation is not None:
            self.generation.cancel()
        self.history.clear()
        await self.query_one("#transcript", VerticalScroll).remove_children()
        self.notify("New chat.")

    def on_unmount(self) -> None:
        if self.generation is not None:
            self.generation.cancel()


def run(options: ChatOptions) -> int:
    app = EdgeEagleChat(options)
    app.run()
    if app.engine is not None:
        app.engine.close()
    return 0
