"""An ensemble of 2 against one of its members, served: ``serving.load(...).predict``, side by side.

One run fits two reversal models briefly (or loads fitted ones with ``--models a.joblib
b.joblib``, e.g. G2P members), exports member 0 as a plain ``Seq2Seq`` and
``Seq2SeqEnsemble.from_fitted`` of both, greedy and beam 5, and times the runtime's ``predict``
over the same sources in chunks of ``--batch-size`` items, on the decode graph (the runtime's
default) and on the step graphs. Each timing is the best of ``--repeats`` interleaved runs on
``--threads`` intra-op threads. It checks that the served ensemble answers what
``Seq2SeqEnsemble.predict`` answers.

    python benchmarks/bench_ensemble.py                 # hidden 128, 512 inputs
    python benchmarks/bench_ensemble.py --quick         # hidden 64, 256 inputs, 1 repeat
"""

from __future__ import annotations

import argparse
import copy
import random
import tempfile
import time
from pathlib import Path

import joblib

import serving
from skattn import Seq2Seq, Seq2SeqEnsemble


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="hidden 64, 256 inputs, 1 repeat")
    parser.add_argument("--models", nargs=2, type=Path, help="two fitted Seq2Seq joblib files")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--n-inputs", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.n_inputs, args.train_steps, args.repeats = 64, 256, 150, 1
    return args


def random_sources(tokens: list[str], count: int, seed: int) -> list[str]:
    """Strings of 4 to 12 of the models' ordinary source tokens (characters)."""
    rng = random.Random(seed)
    singles = [t for t in tokens if len(t) == 1]
    return ["".join(rng.choices(singles, k=rng.randint(4, 12))) for _ in range(count)]


def members(args: argparse.Namespace) -> list[Seq2Seq]:
    if args.models:
        return [joblib.load(path) for path in args.models]
    X = random_sources(list("abcdefghij"), 2000, seed=0)
    params = dict(hidden_size=args.hidden, embedding_dim=32, max_steps=args.train_steps)
    params |= dict(early_stopping=False, device="cpu", n_threads=args.threads)
    return [Seq2Seq(**params, random_state=s).fit(X, [x[::-1] for x in X]) for s in (0, 1)]


def best_time(runtime, sources: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runtime.predict(sources)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> None:
    args = parse_args(argv)
    models = members(args)
    sources = random_sources(models[0].source_vocab_.tokens, args.n_inputs, seed=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for beam in args.beam_sizes:
            single = copy.deepcopy(models[0]).set_params(beam_size=beam)  # the plain model
            pair = Seq2SeqEnsemble.from_fitted(models, beam_size=beam)
            dirs = {name: e.export_onnx(Path(tmp) / f"{name}{beam}") for name, e in
                    (("single", single), ("ensemble", pair))}  # fmt: skip
            for graph in (True, False):
                runtimes = {
                    name: serving.load(
                        d,
                        device="cpu",
                        intra_op_num_threads=args.threads,
                        decode_graph=graph,
                        max_batch_size=args.batch_size,
                    )
                    for name, d in dirs.items()
                }
                agree = runtimes["ensemble"].predict(sources) == pair.predict(sources)
                seconds = {name: float("inf") for name in runtimes}
                for _ in range(args.repeats):  # interleaved
                    for name, runtime in runtimes.items():
                        seconds[name] = min(seconds[name], best_time(runtime, sources, 1))
                rows.append((beam, "decode.onnx" if graph else "step graphs", seconds, agree))
    print(f"{len(sources)} inputs, chunks of {args.batch_size}, {args.threads} thread(s)")
    print("| search | path | one model words/s | ensemble of 2 words/s | ratio | parity |")
    print("|---|---|---:|---:|---:|---|")
    for beam, path, seconds, agree in rows:
        one, two = (len(sources) / seconds[n] for n in ("single", "ensemble"))
        search = "greedy" if beam == 1 else f"beam {beam}"
        print(f"| {search} | {path} | {one:,.0f} | {two:,.0f} | {two / one:.2f}x | {agree} |")


if __name__ == "__main__":
    main()
