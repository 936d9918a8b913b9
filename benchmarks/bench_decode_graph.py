"""decode.onnx against the step graphs: the runtime's two search paths, side by side.

One run fits reversal models briefly (realistic output lengths matter, accuracy does not),
exports each once (the artifact holds both paths), and times ``serving.load(...).predict`` over
the same sources with ``decode_graph=True`` (one ``session.run`` per chunk: the encoder and the
whole search inside onnxruntime) and ``decode_graph=False`` (the NumPy search driving
``decoder_step.onnx`` from Python), in chunks of 1, 64 and 256 items, greedy and beam 5. Both
paths must give identical predictions; each timing is the best of ``--repeats`` interleaved
runs on ``--threads`` intra-op threads. The ratio is graph time / step time (< 1: the graph is
faster). Beside it, the step path's time inside ``InferenceSession.run`` (the encoder and the
step graphs) as a share of its whole time: the ratio the graph would reach if its search
bookkeeping and its loop cost nothing, since the graph runs the same nodes and more.

    python benchmarks/bench_decode_graph.py            # hidden 64 and 256, about 3 minutes
    python benchmarks/bench_decode_graph.py --quick    # hidden 64 only, 128 inputs
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import machine
import numpy as np
import onnxruntime as ort

import serving
from skattn.export import export_module

MODELS = {  # name -> (decoder, scorer, hidden, embedding)
    "small": ("bahdanau", "additive", 64, 32),
    "luong256": ("luong", "general", 256, 64),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small model, 128 inputs")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--n-inputs", type=int, default=512)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.n_inputs, args.train_steps, args.repeats = ["small"], 128, 120, 1
    return args


def reversal_data(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices("abcdefghij", k=rng.randint(4, 12))) for _ in range(count)]


def fit(name: str, args: argparse.Namespace):
    return fit_reversal(name, *MODELS[name], args.train_steps, args.seed)


def fit_reversal(name, decoder, scorer, hidden, embedding, train_steps, seed):
    """A reversal model of this size fitted briefly on one thread (``train_steps`` steps)."""

    from skattn import Seq2Seq

    machine.use_threads(1)
    X = reversal_data(1024, seed)
    print(f"training {name} for {train_steps} steps ...", file=sys.stderr, flush=True)
    return Seq2Seq(
        decoder=decoder,
        scorer=scorer,
        hidden_size=hidden,
        embedding_dim=embedding,
        max_steps=train_steps,
        early_stopping=False,
        learning_rate=3e-3,
        random_state=seed,
        device="cpu",
    ).fit(X, [x[::-1] for x in X])


def export(estimator, beam_size: int, directory: Path) -> Path:
    return export_module(
        estimator.module_,
        directory,
        source_vocabulary=estimator.source_vocab_.to_list(),
        target_vocabulary=estimator.target_vocab_.to_list(),
        tokenizer=estimator.tokenizer,
        beam_size=beam_size,
        max_output_length=24,
    )


class _SessionClock:
    """Seconds spent inside ``onnxruntime.InferenceSession.run`` while active (class-wide)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> _SessionClock:
        self._run = run = ort.InferenceSession.run

        def timed(session, *args, **kwargs):
            start = time.perf_counter()
            try:
                return run(session, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        ort.InferenceSession.run = timed
        return self

    def __exit__(self, *exc) -> None:
        ort.InferenceSession.run = self._run


def best_time(runtime, sources: list[str], batch_size: int) -> tuple[float, list, float]:
    """Seconds for all sources in chunks of ``batch_size``, the predictions, and the seconds
    of that inside ``InferenceSession.run``."""
    predictions = []
    with _SessionClock() as inside:
        start = time.perf_counter()
        for i in range(0, len(sources), batch_size):
            predictions += runtime.predict(sources[i : i + batch_size])
        seconds = time.perf_counter() - start
    return seconds, predictions, inside.seconds


def main(argv=None) -> int:
    args = parse_args(argv)
    print(machine.describe(), flush=True)
    sources = reversal_data(args.n_inputs, args.seed + 1)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            estimator = fit(name, args)
            for beam_size in args.beam_sizes:
                directory = export(estimator, beam_size, Path(scratch) / f"{name}-{beam_size}")
                options = dict(
                    device="cpu",
                    intra_op_num_threads=args.threads,
                    max_batch_size=max(args.batch_sizes),  # a row's batch is one chunk
                )
                graph = serving.load(directory, decode_graph=True, **options)
                steps = serving.load(directory, decode_graph=False, **options)
                for batch_size in args.batch_sizes:
                    times = {"graph": [], "steps": []}
                    outputs = {}
                    for _ in range(args.repeats):  # interleaved
                        for label, runtime in (("graph", graph), ("steps", steps)):
                            seconds, outputs[label], inside = best_time(
                                runtime, sources, batch_size
                            )
                            times[label].append((seconds, inside))
                    if outputs["graph"] != outputs["steps"]:
                        raise SystemExit(f"{name} beam {beam_size}: the two paths differ")
                    g, (s, s_inside) = min(times["graph"])[0], min(times["steps"])
                    length = np.mean([len(p) for p in outputs["graph"]])
                    rows.append((name, beam_size, batch_size, length, s, g, s_inside / s))
                    print_row(*rows[-1], n=len(sources))
    return 0


def print_row(name, beam_size, batch_size, length, steps, graph, share, n) -> None:
    if not hasattr(print_row, "header"):
        print_row.header = True
        print(f"{'model':9} {'beam':>4} {'batch':>5} {'out len':>7} {'steps ms/item':>13} "
              f"{'graph ms/item':>13} {'graph/steps':>11} {'steps in ORT':>12}")  # fmt: skip
    print(
        f"{name:9} {beam_size:4d} {batch_size:5d} {length:7.2f} {1e3 * steps / n:13.3f} "
        f"{1e3 * graph / n:13.3f} {graph / steps:10.2f}x {share:11.2f}x",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
