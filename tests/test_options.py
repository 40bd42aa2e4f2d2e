"""One options model (edge_eagle.options.EngineOptions) builds the engine flags of every front end."""

from __future__ import annotations

import dataclasses
import os

import pytest
from edge_eagle.tui.app import ChatOptions

from edge_eagle.cli import build_parser
from edge_eagle.options import EngineOptions


def _subparser(name: str):
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[name]


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_every_engine_flag_reaches_generate_chat_and_serve(command):
    flags = {s for a in _subparser(command)._actions for s in a.option_strings}
    assert {f.metadata["flag"] for f in EngineOptions.flags()} <= flags


def test_chat_keeps_threads_repack_tree_and_p_min():
    args = build_parser().parse_args(["chat", "--threads", "1", "--repack", "off", "--tree", "5", "--p-min", "0.2",
                                      "--temp", "0.7", "-n", "64"])
    opts = ChatOptions.from_args(args, temperature=args.temp, max_tokens=args.n)
    assert (opts.n_threads, opts.repack, opts.tree, opts.p_min) == (1, "off", 5, 0.2)
    assert (opts.temperature, opts.max_tokens) == (0.7, 64)
    assert opts.engine_kwargs()["n_threads"] == 1  # what EdgeEagle.from_options passes on


def test_serve_takes_tree_and_p_min():
    args = build_parser().parse_args(["serve", "--tree", "7", "--p-min", "0.1", "--k", "4"])
    kw = EngineOptions.from_args(args).engine_kwargs()
    assert (kw["tree"], kw["p_min"], kw["k"]) == (7, 0.1, 4)


def test_bench_shares_the_engine_flags_and_sweeps_its_own():
    args = build_parser().parse_args(["bench", "--threads", "1", "--repack", "on", "--k", "2", "4", "--tree", "7"])
    assert (args.n_threads, args.repack, args.n_ctx) == (1, "on", 2048)  # bench's own default window
    assert (args.k, args.tree) == ([2, 4], [7])


def test_the_library_only_options_have_no_flag_and_the_rest_have_one():
    no_flag = {f.name for f in dataclasses.fields(EngineOptions)} - {f.name for f in EngineOptions.flags()}
    assert no_flag == {"capture", "k_max", "tree_paths"}


def test_repack_travels_as_an_argument_not_through_the_environment(tmp_path, tiny_drafters, monkeypatch):
    from edge_eagle.cli import main

    monkeypatch.delenv("EDGE_EAGLE_REPACK", raising=False)
    assert main(["inspect", str(tiny_drafters["eagle3.1"][0]), "--repack", "off", "--json"]) == 0
    assert "EDGE_EAGLE_REPACK" not in os.environ


def test_a_bad_tree_budget_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "hi", "--tree", "0"])
    assert "node budget of 1 or more" in capsys.readouterr().err
