"""Widgets of `edge-eagle chat`: a chat message and the live statistics panel."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Label, Markdown, Sparkline, Static

from edge_eagle.stats import SpecStats

DRAFT_STYLE = "bold #7ee787"  # accepted draft tokens


class ChatMessage(Vertical):
    """One turn. The assistant's reply streams in; with tinting on, accepted draft tokens
    are coloured (plain text), with tinting off it renders as Markdown."""

    DEFAULT_CSS = """
    ChatMessage { height: auto; margin: 0 0 1 0; padding: 0 1; }
    ChatMessage.user { background: $boost; border-left: thick $accent; }
    ChatMessage.assistant { border-left: thick $success; }
    ChatMessage.error { border-left: thick $error; color: $error; }
    ChatMessage > .role { color: $text-muted; text-style: bold; }
    ChatMessage > Static.body, ChatMessage > Markdown.body { height: auto; margin: 0; padding: 0; }
    """

    tint: reactive[bool] = reactive(True)

    def __init__(self, role: str, content: str = "", tint: bool = True):
        super().__init__(classes=role)
        self.role = role
        self.pieces: list[tuple[str, str]] = [(content, "target")] if content else []
        self.set_reactive(ChatMessage.tint, tint)
        self.footer = ""

    @property
    def text(self) -> str:
        return "".join(p for p, _ in self.pieces)

    def compose(self) -> ComposeResult:
        yield Label({"user": "You", "assistant": "Assistant", "error": "Error"}.get(self.role, self.role),
                    classes="role")
        if self.role == "assistant" and not self.tint:
            yield Markdown(self.text, classes="body")
        else:
            yield Static(self._rich(), classes="body")
        yield Label("", classes="role footer")

    def _rich(self) -> Text:
        out = Text()
        for piece, origin in self.pieces:
            out.append(piece, style=DRAFT_STYLE if origin == "draft" and self.tint and self.role == "assistant"
                       else "")
        return out

    def add(self, pieces: list[tuple[str, str]]) -> None:
        self.pieces.extend(pieces)
        body = self.query(".body").first()
        if isinstance(body, Markdown):
            body.update(self.text)
        elif isinstance(body, Static):
            body.update(self._rich())

    def set_footer(self, text: str) -> None:
        self.footer = text
        self.query(".footer").first(Label).update(text)

    async def watch_tint(self, tint: bool) -> None:
        await self.recompose()
        if self.footer:
            self.set_footer(self.footer)


def drafter_label(drafter, width: int = 40) -> tuple[str, str]:
    """(kind, file) of a drafter for the settings panel, the file name shortened in the middle
    to fit the panel on one line."""
    if drafter is None:
        return "no drafter", ""
    spec = getattr(drafter, "spec", None)
    kind = spec.version if spec is not None else drafter.name
    path = getattr(drafter, "path", "")
    file = path.rsplit("/", 1)[-1] if path else ""
    if len(file) > width:
        half = (width - 1) // 2
        file = file[:half] + "…" + file[-(width - 1 - half):]
    return kind, file


def bar(fraction: float, width: int = 16) -> str:
    full = max(0, min(width, round(fraction * width)))
    return "█" * full + "░" * (width - full)


class StatsPanel(Vertical):
    """tau, per-position acceptance bars, a tokens/s sparkline, the time split, and the
    drafted/accepted counts, for the current message and for the session."""

    DEFAULT_CSS = """
    StatsPanel { width: 44; border-left: solid $primary; padding: 0 1; }
    StatsPanel > .title { text-style: bold; color: $accent; margin-top: 1; }
    StatsPanel > Sparkline { height: 3; margin: 0 0 1 0; }
    StatsPanel > .learning { display: none; }
    StatsPanel.learning > .learning { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield Label("Settings", classes="title")
        yield Static(id="settings")
        yield Label("This message", classes="title")
        yield Static(id="message")
        yield Label("Session", classes="title")
        yield Static(id="session")
        yield Label("Acceptance by draft depth", classes="title")
        yield Static(id="bars")
        yield Label("tokens/s per message", classes="title")
        yield Sparkline([], id="speed")
        yield Label("Learning (--learn)", classes="title learning")
        yield Static(id="learning", classes="learning")

    def show_learning(self, version: int, state: str, report: dict | None,
                      by_version: dict[int, SpecStats]) -> None:
        """The drafter version in use, the background adaptation's state and its last result
        (simulated tau on the held-out requests before and after), and this chat's tau per version."""
        self.add_class("learning")
        lines = [f"drafter version [b]{version}[/]" + (" (as shipped)" if version == 0 else " (adapted)"),
                 f"adaptation: {state}"]
        if report is not None:
            verdict = f"v{report['version']} kept" if report.get("accepted") else "not kept"
            lines.append(f"last: {verdict}, held-out tau {report['tau_before']:.2f} -> {report['tau_after']:.2f}")
        for v, s in sorted(by_version.items()):
            lines.append(f"tau here with v{v}: [b]{s.tau:.2f}[/] ({s.generated} tokens)")
        self.query_one("#learning", Static).update("\n".join(lines))

    def show_settings(self, speculative: bool, drafter, k: int | str, temperature: float, p_min: float,
                      tree: int | None = None) -> None:
        kind, file = drafter_label(drafter)
        mode = f"[b green]ON[/] · {kind}" if speculative else "[b red]OFF[/] · plain decoding"
        shape = f"tree {tree}" if tree else f"k {k}"
        self.query_one("#settings", Static).update(
            f"speculation {mode}\n{file}\n{shape}   temp {temperature:.2f}   p_min {p_min:.2f}")

    @staticmethod
    def _figures(s: SpecStats) -> str:
        d = s.to_dict()  # the one serialisation of the figures, as --json and the server report them
        used = " ".join(f"{kind} {n}" for kind, n in sorted(d["proposers"].items()) if n)
        tree = (f"\ntree {d['tree_nodes_mean']:.1f} nodes, accepted depth {d['accepted_depth_mean']:.2f}"
                if d["proposers"].get("tree") else "")
        share = d["time_share"]
        return (f"tau [b]{d['tau']:.2f}[/]   {d['tokens_per_second']:.1f} tok/s   "
                f"k now {d['k_last']} (mean {d['k_mean']:.1f})\n"
                f"accepted {d['accepted']} / drafted {d['drafted']}"
                f" ({100 * d['acceptance_rate']:.0f}%)\n"
                f"steps: {used or '-'}{tree}\n"
                f"time: verify {100 * share['verify']:.0f}%  draft {100 * share['draft']:.0f}%"
                f"  overhead {100 * share['overhead']:.0f}%")

    def show_message(self, stats: SpecStats) -> None:
        self.query_one("#message", Static).update(self._figures(stats))

    def show_session(self, stats: SpecStats, speeds: list[float]) -> None:
        self.query_one("#session", Static).update(self._figures(stats))
        rates = stats.to_dict()["per_position_acceptance"]
        lines = [f"{i + 1:>2} {bar(r)} {100 * r:3.0f}%" for i, r in enumerate(rates)] or ["(no drafts yet)"]
        if stats.accepted_rank_at:  # trees: which candidate of its depth the accepted node was
            lines.append("tree: accepted candidate's rank")
            for d, row in enumerate(stats.accepted_rank_at):
                n = sum(row) or 1
                lines.append(f"{d + 1:>2} " + "  ".join(f"#{r + 1} {100 * c / n:.0f}%" for r, c in enumerate(row[:3]))
                             + (f"  #4+ {100 * sum(row[3:]) / n:.0f}%" if len(row) > 3 else ""))
        self.query_one("#bars", Static).update("\n".join(lines))
        self.query_one("#speed", Sparkline).data = list(speeds) or [0.0]
