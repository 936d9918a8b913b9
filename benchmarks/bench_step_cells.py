"""Recurrent cells fused or written as products in ``decode.onnx``: the A/B behind
``skattn.export.STEP_CELLS_EXPANDED_FROM``, side by side in one run.

For each width (hidden 64, 128 and 256: the reversal models of ``bench_decode_graph``, fitted
briefly; output lengths matter here, accuracy does not) and each search (greedy, beam 5), three
``decode.onnx`` graphs of the same weights:

- ``fused``: every GRU cell onnxruntime's own ``GRU`` kernel (the export with the threshold out
  of reach);
- ``step``: the decoder step's cells as products and gates (``expand_recurrent``), the encoder's
  fused: what a float32 export writes for beam search, and for greedy search from 128 units on;
- ``all``: the encoder's cells expanded too (a ``Scan`` over time), as int8 exports do.

Each is timed through onnxruntime directly (the runtime's session options, ``--threads``
intra-op threads), over the same chunks of 1, 16, 64 and 256 sources, best of ``--repeats``
interleaved runs; all three must give the same tokens. Ratios are to ``fused`` (< 1: faster).

    python benchmarks/bench_step_cells.py            # about 3 minutes
    python benchmarks/bench_step_cells.py --quick    # hidden 64 and 128, seconds
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import machine
import numpy as np
import onnx
import onnxruntime as ort
from bench_decode_graph import export, fit_reversal, reversal_data

import skattn.export
from serving.sessions import session_options
from skattn.core.inference import source_ids
from skattn.core.manifest import DECODE_FILE
from skattn.core.text import pad_batch
from skattn.onnx_graph import sink_initializers
from skattn.recurrent_graph import expand_recurrent

WIDTHS = {  # hidden -> (decoder, scorer, embedding)
    64: ("bahdanau", "additive", 32),
    128: ("bahdanau", "additive", 64),
    256: ("luong", "general", 64),
}
VARIANTS = ("fused", "step", "all")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="hidden 64 and 128, 128 inputs")
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS), choices=list(WIDTHS))
    parser.add_argument("--n-inputs", type=int, default=1024)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.widths, args.n_inputs, args.train_steps, args.repeats = [64, 128], 128, 40, 1
        args.batch_sizes = [1, 64]
    return args


def fit(hidden: int, args: argparse.Namespace):
    decoder, scorer, embedding = WIDTHS[hidden]
    name = f"hidden {hidden}"
    return fit_reversal(name, decoder, scorer, hidden, embedding, args.train_steps, args.seed)


def variants(estimator, beam_size: int, scratch: Path) -> dict[str, onnx.ModelProto]:
    """The three decode graphs of ``estimator`` (see the module docstring)."""
    thresholds = skattn.export.STEP_CELLS_EXPANDED_FROM
    graphs = {}
    # The export reads the thresholds when it runs: out of reach (every cell fused), then 0
    # (the step's cells expanded at every width).
    for name, value in (("fused", sys.maxsize), ("step", 0)):
        skattn.export.STEP_CELLS_EXPANDED_FROM = dict.fromkeys(thresholds, value)
        try:
            graphs[name] = onnx.load(export(estimator, beam_size, scratch / name) / DECODE_FILE)
        finally:
            skattn.export.STEP_CELLS_EXPANDED_FROM = thresholds
    graphs["all"], _ = expand_recurrent(graphs["step"])  # the encoder's cells too
    sink_initializers(graphs["all"])
    return graphs


def chunk_feeds(estimator, sources: list[str], batch_size: int) -> list[dict]:
    """``decode.onnx``'s inputs for each chunk: ids with the end marker, 0-padded."""
    feeds = []
    for start in range(0, len(sources), batch_size):
        chunk = [list(text) for text in sources[start : start + batch_size]]  # char tokens
        src, lengths = pad_batch(source_ids(estimator.source_vocab_, chunk))
        feeds.append(
            {
                "src": src,
                "src_lengths": lengths,
                "max_length": np.array(24, np.int64),
                "temperature": np.array(1.0, np.float32),
            }
        )
    return feeds


def main(argv=None) -> int:
    args = parse_args(argv)
    print(machine.describe(), flush=True)
    sources = reversal_data(args.n_inputs, args.seed + 1)
    columns = " ".join(f"{v + ' ms/item':>14}" for v in VARIANTS)
    print(f"{'hidden':>6} {'beam':>4} {'batch':>5} {columns} {'step/fused':>10} {'all/fused':>9}")
    with tempfile.TemporaryDirectory() as scratch:
        for hidden in args.widths:
            estimator = fit(hidden, args)
            for beam_size in args.beam_sizes:
                graphs = variants(estimator, beam_size, Path(scratch) / f"{hidden}-{beam_size}")
                options = session_options(args.threads)
                sessions = {
                    name: ort.InferenceSession(
                        graph.SerializeToString(), options, ["CPUExecutionProvider"]
                    )
                    for name, graph in graphs.items()
                }
                at_tokens = {  # the "tokens" output's place among each graph's outputs
                    name: [o.name for o in s.get_outputs()].index("tokens")
                    for name, s in sessions.items()
                }
                for batch_size in args.batch_sizes:
                    feeds = chunk_feeds(estimator, sources, batch_size)
                    if batch_size == 1:
                        feeds = feeds[: max(1, len(feeds) // 4)]  # a quarter: same per-item cost
                    items = sum(len(f["src"]) for f in feeds)
                    for session in sessions.values():  # warm-up
                        session.run(None, feeds[0])
                    best = dict.fromkeys(sessions, float("inf"))
                    tokens = {}  # every timed chunk's tokens (checked below)
                    for _ in range(args.repeats):  # interleaved
                        for name, session in sessions.items():
                            start = time.perf_counter()
                            outputs = [session.run(None, f) for f in feeds]
                            best[name] = min(best[name], time.perf_counter() - start)
                            tokens[name] = [out[at_tokens[name]] for out in outputs]
                    for name in VARIANTS[1:]:
                        pairs = zip(tokens["fused"], tokens[name], strict=True)
                        if not all(np.array_equal(a, b) for a, b in pairs):
                            raise SystemExit(f"hidden {hidden} beam {beam_size}: {name} differs")
                    ms = {name: 1e3 * best[name] / items for name in VARIANTS}  # per item
                    print(
                        f"{hidden:6d} {beam_size:4d} {batch_size:5d} "
                        + " ".join(f"{ms[v]:14.3f}" for v in VARIANTS)
                        + f" {ms['step'] / ms['fused']:9.2f}x {ms['all'] / ms['fused']:8.2f}x",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
