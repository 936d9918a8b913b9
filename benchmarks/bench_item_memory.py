"""Beam search in ``decode.onnx`` with one copy of an item's memory against one per beam.

The recurrent decoders' step reads ``memory``, ``keys`` and ``mask`` with one row per item for
the ``K`` beam rows of the item (``ITEM_MEMORY_KEY``), so the beam graph carries one copy of an
item's memory, scores an item's beams against its keys in one product and gathers ``n`` rows,
not ``n K``, when items stop. This script exports one fitted model twice at the same beam,
as it is and with its step marked as reading one memory row per row (the layout before), and
times ``session.run`` of the two ``decode.onnx`` over the same batches, the rounds alternating,
on one core and one onnxruntime thread. It prints ms per item, the ratio, and how many of the
answers are equal (the two graphs compute the same sums in other orders, so float rounding may
differ in the last bits).

    python benchmarks/bench_item_memory.py                          # the G2P member, int8
    python benchmarks/bench_item_memory.py --quantize none --model PATH.joblib
    python benchmarks/bench_item_memory.py --quick                  # seconds: a small model
    python benchmarks/bench_item_memory.py --transformer --quantize none  # the Transformer

``--artifacts BEFORE AFTER`` compares two artifacts of one G2P model as they are, through
``serving.load(dir).predict`` (one core, one thread, one chunk a call) over the CMUdict test
words: the packaged model as shipped before the change against the same members re-exported::

    mkdir /tmp/before && git archive 6d6a46a serving/models/cmudict-g2p-int8 | tar -x -C /tmp/before
    python benchmarks/bench_item_memory.py --artifacts \
        /tmp/before/serving/models/cmudict-g2p-int8 serving/models/cmudict-g2p-int8

``--step-path ARTIFACT`` does the same for the NumPy beam search over an artifact's step graphs
(the runtime's path where the artifact has no ``decode.onnx``, as the float16 ``cmudict-g2p``):
one runtime lines the memory up one row per beam for every step, as before, the other one row
per item where the step reads it so::

    python benchmarks/bench_item_memory.py --step-path serving/models/cmudict-g2p
    python benchmarks/bench_item_memory.py --step-path serving/models/cmudict-g2p --io-binding
    python benchmarks/bench_item_memory.py --step-path serving/models/cmudict-g2p --n-best 10

``--estimator`` does the same for the fitted model's own ``predict`` (torch), whose steps read
one copy of an item's memory the same way::

    python benchmarks/bench_item_memory.py --estimator --batch-sizes 16 64 256

``--n-best N`` times ``log_likelihood`` (n-best reranking's scoring pass: a source's ``N``
candidates in one chunk where they fit) instead of ``predict``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import machine
import numpy as np
import onnxruntime as ort

import serving
from serving.sessions import session_options
from skattn.core.manifest import DECODE_FILE

HERE = Path(__file__).resolve().parent
MEMBER = HERE / "results" / "g2p" / "member0cc.joblib"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MEMBER, help="a joblib-saved estimator")
    parser.add_argument("--quantize", default="int8", choices=["none", "int8"])
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--n-inputs", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--core", type=int, default=None, help="default: the last usable core")
    parser.add_argument("--quick", action="store_true", help="a small reversal model")
    parser.add_argument(
        "--transformer", action="store_true",
        help="a Transformer (2 + 2 layers of 256, 4 heads) trained --train-steps on reversal",
    )  # fmt: skip
    parser.add_argument("--train-steps", type=int, default=300, help="with --transformer")
    parser.add_argument(
        "--artifacts", type=Path, nargs=2, metavar=("BEFORE", "AFTER"), default=None,
        help="compare two artifacts of one G2P model as they are (predict, test words)",
    )  # fmt: skip
    parser.add_argument(
        "--step-path", type=Path, metavar="ARTIFACT", default=None,
        help="the NumPy beam search over an artifact's step graphs, per row against per item",
    )  # fmt: skip
    parser.add_argument(
        "--n-best", type=int, default=0, metavar="N",
        help="with --step-path: log_likelihood of N candidates a word instead of predict",
    )  # fmt: skip
    parser.add_argument(
        "--estimator", action="store_true",
        help="the model's own predict (torch), per row against per item (G2P words)",
    )  # fmt: skip
    parser.add_argument(
        "--io-binding", action="store_true",
        help="with --step-path: the carry on the device (IO binding, as on CUDA), on the CPU",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if (args.n_best or args.io_binding) and args.step_path is None:
        parser.error("--n-best and --io-binding go with --step-path")
    if args.n_best < 0:
        parser.error("--n-best must be at least 1 (or 0: predict)")
    if args.beam_size < 2:
        parser.error("--beam-size must be at least 2 (greedy search has one row per item)")
    if args.quick:
        args.model, args.n_inputs, args.repeats, args.batch_sizes = None, 128, 1, [1, 8, 32]
    return args


def load_model(args):
    """The estimator and the sources to decode: the G2P model's CMUdict test words, or
    ``bench_decode_graph``'s small reversal model and its letter strings, or (``--transformer``)
    a Transformer of the G2P probes' size trained briefly on the same letter strings."""
    if args.transformer:
        import bench_decode_graph

        from skattn import Seq2Seq

        machine.use_threads(1)
        X = bench_decode_graph.reversal_data(2048, 0)
        print(f"training a Transformer for {args.train_steps} steps ...", flush=True)
        estimator = Seq2Seq(
            encoder="transformer", decoder="transformer", hidden_size=256, num_heads=4,
            num_layers=2, max_steps=args.train_steps, early_stopping=False, random_state=0,
            device="cpu",
        ).fit(X, [x[::-1] for x in X])  # fmt: skip
        return estimator, bench_decode_graph.reversal_data(args.n_inputs, 1)
    if args.model is None:
        import bench_decode_graph

        estimator = bench_decode_graph.fit_reversal("small", "bahdanau", "additive", 64, 32, 60, 0)
        return estimator, bench_decode_graph.reversal_data(args.n_inputs, 1)
    import bench_runtime_chunks

    return bench_runtime_chunks.g2p_model(args.model, args.n_inputs)


def per_row(estimator):
    """A copy of ``estimator`` whose step says it reads one memory row per row."""
    estimator = copy.deepcopy(estimator)  # export_onnx copies the module it traces
    module = estimator.module_
    target = module if hasattr(module, "members") else module.decoder
    target.item_memory = False
    assert not module.item_memory
    return estimator


def captured_feeds(directory: Path, sources: list[str], batch_size: int) -> list[dict]:
    """The ``decode.onnx`` feeds ``serving.load(directory).predict`` sends for ``sources`` in
    batches of ``batch_size`` (one chunk each)."""
    runtime = serving.load(
        directory, device="cpu", decode_graph=True, intra_op_num_threads=1, max_batch_size=256
    )
    feeds, run = [], ort.InferenceSession.run

    def capture(session, output_names, input_feed, *rest, **kwargs):
        if "max_length" in input_feed:
            feeds.append(dict(input_feed))
        return run(session, output_names, input_feed, *rest, **kwargs)

    ort.InferenceSession.run = capture
    try:
        for i in range(0, len(sources), batch_size):
            runtime.predict(sources[i : i + batch_size])
    finally:
        ort.InferenceSession.run = run
    return feeds


def alternating_times(runs, repeats: int, items: int) -> list[list[float]]:
    """CPU seconds an item of each of ``runs`` (callables), ``repeats`` rounds taking turns."""
    times = [[] for _ in runs]
    for _ in range(repeats):
        for run, seconds in zip(runs, times, strict=True):
            start = time.process_time()
            run()
            seconds.append((time.process_time() - start) / items)
    return times


def compare_artifacts(args) -> list[tuple]:
    """``--artifacts``: each artifact's ``predict`` CPU time a word at each batch size (medians of
    ``--repeats`` alternating rounds over ``--n-inputs`` test words; 256 words at batch 1), and
    how many of all the test words' answers the two share."""
    options = dict(intra_op_num_threads=1, workers=1, max_batch_size=max(args.batch_sizes))
    runtimes = [serving.load(d, "cpu", **options) for d in args.artifacts]
    return compare_runtimes(args, runtimes, ("before", "after"), every_word=True)


def compare_step_path(args) -> list[tuple]:
    """``--step-path``: one artifact decoded over its step graphs by the NumPy beam search, its
    memory lined up one row per beam (``backend.item_memory`` off) and one row per item."""
    options = dict(intra_op_num_threads=1, workers=1, max_batch_size=max(args.batch_sizes))
    path, options["io_binding"] = args.step_path, args.io_binding
    runtimes = [serving.load(path, "cpu", decode_graph=False, **options) for _ in range(2)]
    if not runtimes[1].backend.item_memory:
        sys.exit(f"{path}: its step reads one memory row per row: nothing to compare")
    if runtimes[1].manifest.beam_size < 2:
        sys.exit(f"{path}: greedy search has one row per item: nothing to compare")
    runtimes[0].backend.item_memory = False
    if args.n_best:
        return compare_scoring(args, runtimes)
    return compare_runtimes(args, runtimes, ("per row", "per item"), every_word=False)


def compare_estimator(args) -> list[tuple]:
    """``--estimator``: the fitted model's own ``predict`` (torch, ``TorchBackend``), its steps
    reading one memory row per beam (a copy whose decoder says so) and one row per item."""
    estimator, sources = load_model(args)
    estimator.set_params(beam_size=args.beam_size)  # settable after fit; a call is one chunk
    models = [per_row(estimator), estimator]
    return compare_runtimes(args, models, ("per row", "per item"), False, sources)


def compare_scoring(args, runtimes) -> list[tuple]:
    """``--step-path --n-best N``: ``log_likelihood`` of ``N`` candidates a word (the word's
    first pronunciation and others drawn from the test words', as an n-best list to rerank),
    per row against per item: CPU time a pair, and the largest difference of the scores."""
    import random

    from skattn.datasets import load_cmudict

    X, y = load_cmudict("test")
    first = dict(zip(X, y, strict=True))  # a word's last pronunciation: any one serves
    words = sorted(first)[:: max(1, len(first) // args.n_inputs)][: args.n_inputs]
    rng, pronunciations = random.Random(0), list(y)
    sources = [word for word in words for _ in range(args.n_best)]
    outputs = [first[w] if i % args.n_best == 0 else rng.choice(pronunciations)
               for i, w in enumerate(sources)]  # fmt: skip
    scores = [runtime.log_likelihood(sources, outputs) for runtime in runtimes]
    largest = float(np.max(np.abs(scores[0] - scores[1])))
    print(
        f"{len(words)} words, {args.n_best} candidates each: scores differ by {largest:.2e} at most"
    )
    runs = [functools.partial(runtime.log_likelihood, sources, outputs) for runtime in runtimes]
    times = alternating_times(runs, args.repeats, len(sources))
    before, after = (statistics.median(t) for t in times)
    print(
        f"per row {1e3 * before:.4f} ms a pair, per item {1e3 * after:.4f}: {after / before:.3f}x"
    )
    return [(args.n_best, before, after, largest, len(sources))]


def compare_runtimes(args, runtimes, labels, every_word: bool, sources=None) -> list[tuple]:
    """Two runtimes of one model over ``sources`` (default: a G2P model's CMUdict test words):
    the answers they share (all the words, or the timed ones), then ``predict``'s CPU time a
    word at each batch size."""
    from skattn.datasets import load_cmudict

    words = sorted(set(load_cmudict("test")[0])) if sources is None else list(sources)
    step = max(1, len(words) // args.n_inputs)
    sample, rows = words[::step][: args.n_inputs], []
    compared = words if every_word else sample
    answers = [runtime.predict(compared) for runtime in runtimes]
    same = sum(a == b for a, b in zip(*answers, strict=True))
    print(f"equal answers: {same} of {len(compared)} test words")
    print(f"{'batch':>5} {labels[0] + ' ms/word':>15} {labels[1] + ' ms/word':>16} {'ratio':>7}")
    for batch_size in args.batch_sizes:
        chosen = sample[:256] if batch_size == 1 else sample
        calls = [chosen[i : i + batch_size] for i in range(0, len(chosen), batch_size)]
        runs = [functools.partial(_predict_all, runtime, calls) for runtime in runtimes]
        times = alternating_times(runs, args.repeats, len(chosen))
        before, after = (statistics.median(t) for t in times)
        print(f"{batch_size:>5} {1e3 * before:>15.3f} {1e3 * after:>16.3f} {after / before:>6.3f}x")
        rows.append((batch_size, before, after, same, len(compared)))
    return rows


def _predict_all(runtime, calls: list) -> None:
    for call in calls:
        runtime.predict(call)


def _run_all(session: ort.InferenceSession, feeds: list[dict]) -> None:
    for feed in feeds:
        session.run(None, feed)


def main(argv=None) -> list[tuple]:
    args = parse_args(argv)
    core = args.core if args.core is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    machine.use_threads(1)
    print(machine.describe(), f" one core ({core}), one onnxruntime thread", flush=True)
    if args.artifacts is not None:
        return compare_artifacts(args)
    if args.step_path is not None:
        return compare_step_path(args)
    if args.estimator:
        return compare_estimator(args)
    estimator, sources = load_model(args)
    estimator.set_params(beam_size=args.beam_size)  # settable after fit
    quantize = None if args.quantize == "none" else args.quantize
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        layouts, directory = {}, None
        for label, model in (("per row", per_row(estimator)), ("per item", estimator)):
            directory = Path(scratch) / label.replace(" ", "_")  # the feeds come from the last
            model.export_onnx(directory, quantize=quantize)
            options = session_options(1)
            layouts[label] = ort.InferenceSession(
                str(directory / DECODE_FILE), options, providers=["CPUExecutionProvider"]
            )
        name = "G2P model" if args.model is not None else "small reversal model"
        name = "Transformer (reversal)" if args.transformer else name
        print(f"{name}, beam {args.beam_size}, quantize={args.quantize}, {len(sources)} inputs")
        print(f"{'batch':>5} {'per row ms/item':>16} {'per item ms/item':>17} {'ratio':>6} "
              f"{'rounds':>22} {'equal answers':>14}")  # fmt: skip
        for batch_size in args.batch_sizes:
            feeds = captured_feeds(directory, sources, batch_size)
            outputs = {label: [s.run(None, f) for f in feeds] for label, s in layouts.items()}
            same = sum(
                np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                for a, b in zip(outputs["per row"], outputs["per item"], strict=True)
            )
            runs = [functools.partial(_run_all, session, feeds) for session in layouts.values()]
            per_beam, per_item = alternating_times(runs, args.repeats, len(sources))
            old, new = statistics.median(per_beam), statistics.median(per_item)
            ratios = [n / o for o, n in zip(per_beam, per_item, strict=True)]
            spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
            print(f"{batch_size:>5} {1e3 * old:>16.3f} {1e3 * new:>17.3f} {new / old:>5.3f}x "
                  f"{spread:>22} {same:>7}/{len(feeds)} batches", flush=True)  # fmt: skip
            rows.append((batch_size, old, new, same, len(feeds)))
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
