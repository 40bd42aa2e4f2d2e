"""The opt-in learn store: nothing kept without the opt-in; a finished request's prompt and answer
ids kept exactly, across restarts, under a cap; safe against two processes, a kill mid-write and a
damaged file; and `edge-eagle learn status | reset | export`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edge_eagle import EdgeEagle
from edge_eagle.cli import main
from edge_eagle.learn import LearnStore, all_stores, store_dir

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def learn_root(tmp_path, monkeypatch):
    root = tmp_path / "learn"
    monkeypatch.setenv("EDGE_EAGLE_LEARN_DIR", str(root))
    return root


def test_nothing_is_stored_without_the_opt_in(tiny_target, learn_root):
    with EdgeEagle(tiny_target, None, n_ctx=256) as ee:
        ee.generate("Once upon a time", max_tokens=8).result()
        assert ee.learn_store is None
    assert not learn_root.exists()


def test_a_finished_request_is_kept_exactly_and_survives_a_restart(tiny_target, learn_root):
    with EdgeEagle(tiny_target, None, n_ctx=256, learn=True) as ee:
        gen = ee.generate("Once upon a time", max_tokens=8).result()
        prompt = ee.target.tokenize("Once upon a time")
        cancelled = ee.generate("A cancelled one", max_tokens=64)
        next(iter(cancelled))
        cancelled.cancel()
        cancelled.result()
        assert cancelled.finish_reason == "cancelled"
    store = LearnStore(store_dir(tiny_target, None))  # a new process would open it the same way
    kept = list(store.requests())
    assert [(p, a) for p, a, _ in kept] == [(prompt, gen.tokens)]  # the cancelled request is not kept
    assert store.status()["tokens"] == len(prompt) + len(gen.tokens)
    with EdgeEagle(tiny_target, None, n_ctx=256, learn=True) as again:
        again.generate("Twice upon a time", max_tokens=4).result()
    assert len(list(store.requests())) == 2


def test_the_store_keeps_under_its_cap_by_dropping_the_oldest(tmp_path):
    store = LearnStore(tmp_path / "s", max_tokens=100)
    for i in range(30):
        assert store.add([i] * 5, [i] * 5)
    kept = list(store.requests())
    assert store.status()["tokens"] <= 100
    assert [p[0] for p, _, _ in kept] == list(range(20, 30))  # the newest ten, oldest first
    # at the cap the count stays, and the requests ever kept (what starts an adaptation) still grow
    assert store.status()["requests"] == 10 and store.added() == 30
    assert not store.add([1] * 60, [2] * 41)  # longer than the cap alone: not kept, nothing dropped
    assert len(list(store.requests())) == 10 and store.added() == 30
    (tmp_path / "s" / "work").mkdir()
    (tmp_path / "s" / "work" / "train.npz").write_bytes(b"features of the requests")
    assert store.reset() == 10 and not list(store.requests())
    assert not (tmp_path / "s" / "work").exists()  # what adaptation derived from them goes too


def test_a_damaged_store_is_set_aside_and_started_afresh(tmp_path):
    d = tmp_path / "s"
    LearnStore(d).add([1, 2], [3])
    (d / "requests.sqlite").write_bytes(b"this is not a database" * 100)
    for extra in d.glob("requests.sqlite-*"):
        extra.unlink()
    store = LearnStore(d)
    assert store.recovered is not None and "moved to requests.sqlite.corrupt-" in store.recovered
    assert list(d.glob("requests.sqlite.corrupt-*"))
    assert not list(store.requests())
    store.add([4], [5])
    assert [(p, a) for p, a, _ in store.requests()] == [([4], [5])]


_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from edge_eagle.learn import LearnStore
    store = LearnStore({path!r}, max_tokens=10**9)
    tag, count = int(sys.argv[1]), int(sys.argv[2])
    print("ready", flush=True)
    i = 0
    while count < 0 or i < count:
        store.add([tag] * 50, [i] * 200)
        i += 1
""")


def _writer(path: Path, tag: int, count: int) -> subprocess.Popen:
    code = _WRITER.format(root=str(ROOT), path=str(path))
    return subprocess.Popen([sys.executable, "-c", code, str(tag), str(count)], stdout=subprocess.PIPE, text=True)


def test_two_processes_write_one_store_at_once(tmp_path):
    d = tmp_path / "s"
    procs = [_writer(d, tag, 40) for tag in (1, 2)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    kept = list(LearnStore(d).requests())
    assert sorted(p[0] for p, _, _ in kept) == [1] * 40 + [2] * 40
    for tag in (1, 2):  # each writer's requests in its own order, none torn
        assert [a[0] for p, a, _ in kept if p[0] == tag] == list(range(40))
        assert all(len(p) == 50 and len(a) == 200 for p, a, _ in kept)


def test_a_writer_killed_mid_write_leaves_a_whole_store(tmp_path):
    d = tmp_path / "s"
    proc = _writer(d, 7, -1)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    while not list(LearnStore(d).requests(limit=20)) or len(list(LearnStore(d).requests(limit=20))) < 20:
        assert time.monotonic() < deadline, "the writer wrote nothing"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    store = LearnStore(d)
    assert store.recovered is None
    kept = list(store.requests())
    assert len(kept) >= 20
    assert [a[0] for _, a, _ in kept] == list(range(len(kept)))  # every committed request, whole and in order
    assert all(len(p) == 50 and len(a) == 200 for p, a, _ in kept)
    store.add([1], [2])  # and it takes new ones


def test_the_learn_command_reports_exports_and_resets(tiny_target, learn_root, tmp_path, capsys):
    with EdgeEagle(tiny_target, "none", n_ctx=256, learn=True) as ee:
        gen = ee.generate("Once upon a time", max_tokens=6).result()
    args = ["--target", str(tiny_target), "--drafter", "none"]
    assert main(["learn", "status", *args, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["requests"] == 1 and status["target"] == os.path.realpath(tiny_target)
    out = tmp_path / "export.jsonl"
    assert main(["learn", "export", *args, "--out", str(out), "--text"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["answer_ids"] == gen.tokens and rows[0]["answer"] == gen.text
    assert main(["learn", "status", "--all", "--json"]) == 0
    assert [s["requests"] for s in json.loads(capsys.readouterr().out)["stores"]] == [1]
    assert main(["learn", "reset", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 1
    assert all_stores() and not list(LearnStore(all_stores()[0]).requests())
    assert main(["learn", "export", *args]) == 2  # no --out: a one-sentence error
    assert "--out" in capsys.readouterr().err
