"""`edge-eagle chat` driven end to end by Textual's Pilot on the tiny synthetic models."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from edge_eagle.tui.app import ChatOptions, EdgeEagleChat
from edge_eagle.tui.widgets import ChatMessage
from textual.widgets import Input, Static

from edge_eagle import EdgeEagle


@pytest.fixture()
def engine(tiny_target, tiny_drafters):
    ee = EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k=3, n_ctx=1024)
    yield ee
    ee.close()


async def _idle(pilot, app: EdgeEagleChat, timeout: float = 60) -> None:
    start = time.monotonic()
    await pilot.pause()
    while app.busy:
        assert time.monotonic() - start < timeout, "generation did not finish"
        await pilot.pause(0.05)
    await pilot.pause()


async def _ask(pilot, app: EdgeEagleChat, text: str) -> None:
    app.query_one("#prompt", Input).value = text
    await pilot.press("enter")


def _static(app: EdgeEagleChat, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def test_type_stream_and_stats(engine, tmp_path):
    async def run():
        app = EdgeEagleChat(ChatOptions(max_tokens=24, k=3), engine=engine, save_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await _ask(pilot, app, "Tell me a story")
            await _idle(pilot, app)
            messages = list(app.query(ChatMessage))
            assert [m.role for m in messages] == ["user", "assistant"]
            reply = messages[1]
            assert reply.text and len(app.history) == 2
            assert "tau" in _static(app, "#message") and "tau" in _static(app, "#session")
            assert "accepted" in _static(app, "#session")
            assert app.speeds and app.speeds[0] > 0
            assert "24 tokens" in reply.footer and "speculative" in reply.footer
            # per-position bars once drafts exist
            assert "%" in _static(app, "#bars")
            # second turn goes through the chat history
            await _ask(pilot, app, "And another")
            await _idle(pilot, app)
            assert len(app.history) == 4
            await pilot.press("ctrl+s")
            saved = list(tmp_path.glob("edge-eagle-chat-*.md"))
            assert len(saved) == 1 and "Tell me a story" in saved[0].read_text()
            await pilot.press("ctrl+n")
            await pilot.pause()
            assert not app.query(ChatMessage) and not app.history
    asyncio.run(run())


def test_escape_stops_generation_cleanly(engine):
    async def run():
        app = EdgeEagleChat(ChatOptions(max_tokens=700, k=3), engine=engine)
        async with app.run_test(size=(120, 40)) as pilot:
            await _ask(pilot, app, "Go on forever")
            reply = list(app.query(ChatMessage))[-1]
            deadline = time.monotonic() + 60
            while not reply.text:  # stop as soon as the reply has started
                assert time.monotonic() < deadline, "the reply did not start"
                await pilot.pause(0.01)
            await pilot.press("escape")
            await _idle(pilot, app)
            assert "cancelled" in reply.footer
            stopped = engine.last_stats.generated  # well before the 700 tokens asked for
            assert 0 < stopped < 700 and f"{stopped} tokens" in reply.footer
            # the engine still works after the cancel
            app.options.max_tokens = 16
            await _ask(pilot, app, "Short one")
            await _idle(pilot, app)
            assert list(app.query(ChatMessage))[-1].footer
    asyncio.run(run())


def test_toggles_and_settings(engine):
    async def run():
        app = EdgeEagleChat(ChatOptions(max_tokens=16, k=3), engine=engine)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("f8")  # speculation off: the A/B switch
            await pilot.press("f3", "f3", "f5")
            await pilot.pause()
            settings = _static(app, "#settings")
            assert "OFF" in settings and "k 5" in settings and "temp 0.10" in settings
            await pilot.press("f4")
            await _ask(pilot, app, "Plain please")
            await _idle(pilot, app)
            reply = list(app.query(ChatMessage))[-1]
            assert "plain" in reply.footer and engine.last_stats.drafted == 0
            await pilot.press("f8")
            await _ask(pilot, app, "Speculative please")
            await _idle(pilot, app)
            reply = list(app.query(ChatMessage))[-1]
            assert "speculative" in reply.footer and engine.last_stats.drafted > 0
            draft_spans = [s for s in reply._rich().spans if s.style]
            assert bool(draft_spans) == (engine.last_stats.accepted > 0)
            await pilot.press("f9")  # tint off: Markdown rendering, no styled spans
            await pilot.pause()
            assert not reply.tint and not [s for s in reply._rich().spans if s.style]
    asyncio.run(run())


def test_tree_mode_shows_tree_figures_and_a_one_line_drafter_label(engine):
    async def run():
        app = EdgeEagleChat(ChatOptions(max_tokens=24, k=3), engine=engine)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            settings = _static(app, "#settings").splitlines()
            # the drafter's kind and its file on their own lines, each within the panel
            assert "EAGLE-3.1" in settings[0] and all(len(line) <= 42 for line in settings)
            await pilot.press("f10")  # chains -> trees of 7 nodes
            await pilot.pause()
            assert "tree 7" in _static(app, "#settings") and app.options.tree == 7
            await _ask(pilot, app, "Tell me a story")
            await _idle(pilot, app)
            s = engine.last_stats
            assert s.proposers.get("tree", 0) > 0 and s.tree_nodes_mean > 1
            assert "tree" in _static(app, "#message") and "nodes" in _static(app, "#message")
            if s.accepted:
                assert "rank" in _static(app, "#bars")
            await pilot.press("f10", "f10")  # -> 15 -> chains again
            await pilot.pause()
            assert app.options.tree is None and "k 3" in _static(app, "#settings")
    asyncio.run(run())


def test_tree_stats_render_each_depth_and_rank():
    from edge_eagle.tui.widgets import StatsPanel

    from edge_eagle.stats import SpecStats

    s = SpecStats()
    s.record_step(7, 2, kind="tree", depth=3, ranks=[0, 1])
    s.record_step(7, 1, kind="tree", depth=2, ranks=[2])
    assert s.accepted_rank_at == [[1, 0, 1], [0, 1]]
    assert s.tree_nodes_mean == 7 and s.tree_depth_mean == 2.5 and s.per_position_acceptance == [1.0, 0.5, 0.0]
    text = StatsPanel._figures(s)
    assert "tree 7.0 nodes" in text and "steps: tree 2" in text


def test_bad_model_shows_a_message_not_a_traceback(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 10)

    async def run():
        app = EdgeEagleChat(ChatOptions(target=str(junk), drafter="none"))
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if app.query(ChatMessage):
                    break
            (msg,) = app.query(ChatMessage)
            assert msg.role == "error" and "not a GGUF" in msg.text
            assert app.query_one("#prompt", Input).disabled
    asyncio.run(run())


def test_main_screen_snapshot(engine, snap_compare):
    app = EdgeEagleChat(ChatOptions(k=3), engine=engine)
    assert snap_compare(app, terminal_size=(110, 32))


def _fixed_stats():
    """Figures of a finished reply, fixed so that the screen is the same on every machine."""
    from edge_eagle.stats import SpecStats

    s = SpecStats(prompt_tokens=12, generated=9, t_prefill=0.05, t_verify=0.2, t_draft=0.05, t_total=0.3)
    for drafted, accepted in ((3, 2), (3, 3), (3, 0)):
        s.record_step(drafted, accepted)
    return s


def test_reply_with_tinted_drafts_and_stats_snapshot(engine, snap_compare):
    """A finished reply: accepted drafts tinted, the message and session figures, the bars."""
    app = EdgeEagleChat(ChatOptions(k=3), engine=engine)

    async def reply(pilot):
        await pilot.pause()
        app._append(ChatMessage("user", "Tell me a story"))
        message = app._append(ChatMessage("assistant"))
        stats = _fixed_stats()
        app.post_message(app.Tokens(message, [("Once", "target"), (" upon", "draft"), (" a", "draft"),
                                              (" time", "target")], stats))
        app.engine.stats = stats
        app.post_message(app.Finished(message, stats, "stop"))
        await pilot.pause()

    assert snap_compare(app, terminal_size=(110, 32), run_before=reply)


def test_settings_after_keys_snapshot(engine, snap_compare):
    """Speculation off, k raised twice, temperature up, trees of 7 nodes: the settings panel."""
    app = EdgeEagleChat(ChatOptions(k=3), engine=engine)
    assert snap_compare(app, terminal_size=(110, 32), press=["f8", "f3", "f3", "f5", "f10"])


def test_model_that_fails_to_load_snapshot(tmp_path, snap_compare):
    """The error state: the message says what is wrong, the prompt stays disabled."""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 10)
    app = EdgeEagleChat(ChatOptions(target=str(junk), drafter="none"))

    async def loaded(pilot):
        deadline = time.monotonic() + 60
        while not app.query(ChatMessage):
            assert time.monotonic() < deadline, "no error message appeared"
            await pilot.pause(0.05)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(110, 32), run_before=loaded)


@pytest.mark.smollm
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_real_terminal_smoke_with_the_default_model(tmp_path):
    """tmux runs `edge-eagle chat` on the embedded default model; send a question, read the screen."""
    session = f"ee-smoke-{os.getpid()}"
    exe = Path(sys.executable).parent / "edge-eagle"
    env = "HF_HUB_OFFLINE=1 TERM=xterm-256color"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "140", "-y", "45",
                    f"cd {tmp_path} && {env} {exe} chat -n 32"], check=True)
    subprocess.run(["tmux", "resize-window", "-t", session, "-x", "140", "-y", "45"], capture_output=True)
    try:
        def screen() -> str:
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True).stdout

        deadline = time.time() + 300
        while "Ask something" not in screen():
            assert time.time() < deadline, screen()
            time.sleep(0.5)
        subprocess.run(["tmux", "send-keys", "-t", session, "What is the capital of France?", "Enter"], check=True)
        deadline = time.time() + 300
        while "32 tokens" not in screen():
            assert time.time() < deadline, screen()
            time.sleep(0.5)
        text = screen()
        assert "Assistant" in text and "tau" in text and "accepted" in text
        subprocess.run(["tmux", "send-keys", "-t", session, "C-q"], check=True)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
