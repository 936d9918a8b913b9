"""Long searches: decode.onnx against the step graphs on a model that never ends.

A search that runs to its output limit is where a beam search's bookkeeping shows: a search
that copied every beam's tokens and attention rows at each reordering grew with the square of
the output length. One run fits a small reversal model for a few steps, sets the output bias
of ``EOS`` to -1e4 (so every search runs to ``max_output_length``), exports it at each beam
width and output limit, and times ``serving.load(...).predict`` of one source with
``decode_graph=True`` (the whole search in one ``session.run``) and ``decode_graph=False``
(the NumPy search over the step graphs), on ``--threads`` intra-op threads, the best of
``--repeats`` interleaved runs. Both paths must give the same output. The ratio is graph time /
step time; "growth" is each path's time over its time at the previous, half, limit (2.0:
linear, 4.0: quadratic). Every search runs all its steps, though at a beam wider than the
target vocabulary the answer is the empty hypothesis that ended at the first step (a
hypothesis cut at the limit never competes with one that ended).

    python benchmarks/bench_long_search.py                       # beam 64 and 5, 256-2,048 tokens
    python benchmarks/bench_long_search.py --limits 1024 2048 4096 --beam-sizes 64
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import machine
import torch

import serving
from skattn import Seq2Seq
from skattn.core.text import EOS


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[64, 5])
    parser.add_argument("--source-length", type=int, default=50)
    parser.add_argument("--hidden-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    for name in ("limits", "beam_sizes"):
        if min(getattr(args, name)) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 1 <= args.source_length <= 4096:
        parser.error("--source-length must be in [1, 4096]")
    if args.hidden_size < 1 or args.threads < 1 or args.repeats < 1:
        parser.error("--hidden-size, --threads and --repeats must be >= 1")
    return args


def never_ending(hidden_size: int, limit: int) -> Seq2Seq:
    X, y = ["12", "345", "6789"] * 8, ["21", "543", "9876"] * 8
    model = Seq2Seq(hidden_size=hidden_size, embedding_dim=8, max_steps=3)
    model.set_params(max_output_length=limit, early_stopping=False, device="cpu", random_state=0)
    model.fit(X, y)
    with torch.no_grad():  # EOS never wins: every search runs to its limit
        model.module_.decoder.output.bias[EOS] = -1e4
    return model


def best_time(runtime, source: str, repeats: int) -> tuple[float, list]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = runtime.predict([source])
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv=None) -> int:
    args = parse_args(argv)
    print(machine.describe())
    torch.set_num_threads(args.threads)
    source = ("1234567890" * (args.source_length // 10 + 1))[: args.source_length]
    print(f"one source of {len(source)} characters, hidden {args.hidden_size}, "
          f"{args.threads} intra-op thread(s), best of {args.repeats}")  # fmt: skip
    print("| beam | limit | decode.onnx s | step graphs s | ratio | growth graph | growth steps |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for beam in args.beam_sizes:
            previous = None
            for limit in sorted(args.limits):
                model = never_ending(args.hidden_size, limit).set_params(beam_size=beam)
                directory = model.export_onnx(Path(tmp) / f"b{beam}_l{limit}")
                paths = {
                    graph: serving.load(
                        directory, decode_graph=graph, intra_op_num_threads=args.threads
                    )
                    for graph in (True, False)
                }
                times, outs = {True: float("inf"), False: float("inf")}, {}
                for _ in range(args.repeats):  # interleaved
                    for graph, runtime in paths.items():
                        seconds, outs[graph] = best_time(runtime, source, 1)
                        times[graph] = min(times[graph], seconds)
                if outs[True] != outs[False]:
                    print(f"beam {beam}, limit {limit}: the paths disagree", file=sys.stderr)
                    return 1
                growth = (
                    [f"{times[g] / previous[g]:.2f}" for g in (True, False)]
                    if previous
                    else ["-", "-"]
                )
                print(f"| {beam} | {limit:,} | {times[True]:.3f} | {times[False]:.3f} | "
                      f"{times[True] / times[False]:.2f} | {growth[0]} | {growth[1]} |",
                      flush=True)  # fmt: skip
                previous = times
    return 0


if __name__ == "__main__":
    sys.exit(main())
