"""What per-layer and per-head attention maps cost, side by side with the default map.

One run fits a small Transformer (encoder and decoder) on string reversal briefly (realistic
output lengths matter, accuracy does not), exports it, and times in onnxruntime
(``serving.load``, the default search path) over the same sources, in chunks of 1, 16 and 64:

- ``predict``: no maps;
- ``default``: the default map (the last layer, averaged over heads), which the search collects;
- ``one head``: ``layer=0, head=1``, one extra teacher-forced run of ``attention.onnx`` per chunk
  after the search (:mod:`skattn.core.attention_maps`);
- ``all``: ``layer="all", head="all"``, every layer's and head's maps (same run, more output).

Then it measures the alternative design, every layer's and head's weights as a second output of
the decoder step (carried through the search on every step of every request): one
``decoder_step.onnx`` run against a step graph that also outputs ``(B, layers, heads, T)``, at
the chunk sizes above, with a cache of ``--prefix`` positions. That is a lower bound of its
cost, since the search would also carry and reorder those weights; what carrying them costs is
simulated last: the step-graph search (``decode_graph=False``, greedy and beam 5, the largest
chunk) with every step's weights made ``layers x heads`` times wider (``np.tile``), as the
alternative's would be, on every request, maps or not. Each timing is the best of
``--repeats`` interleaved runs on one intra-op thread; ratios are against ``default``.

    python benchmarks/bench_attention_maps.py            # 256 inputs, about 2 minutes
    python benchmarks/bench_attention_maps.py --quick    # 2 x 2 heads, 24 inputs: seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

import serving
from skattn import Seq2Seq
from skattn.tracing import step_inputs, to_onnx


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model, 24 inputs")
    parser.add_argument("--n-inputs", type=int, default=256)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--prefix", type=int, default=10, help="cache length of the step timing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.n_inputs, args.train_steps, args.repeats = 24, 20, 1
        args.hidden, args.layers, args.heads, args.batch_sizes = 32, 2, 2, [1, 16]
    return args


def reversal(count: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    sources = ["".join(rng.choices("abcdefghij", k=rng.randint(4, 12))) for _ in range(count)]
    return sources, [s[::-1] for s in sources]


def best_of(repeats: int, runs: dict) -> dict[str, float]:
    """Each callable's best wall time over ``repeats`` interleaved rounds."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def chunked(runtime, sources: list[str], size: int, **options):
    def run() -> None:
        for start in range(0, len(sources), size):
            runtime.predict_batch(sources[start : start + size], **options)

    return run


class _StepEveryLayer(nn.Module):
    """The decoder step with every layer's and head's weights as its output: the alternative."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model.eval()

    def forward(self, y_prev, self_keys, self_values, memory, keys, mask, temperature, position):
        decoder = self.model.decoder
        logits, state, weights = decoder._decode(
            y_prev[:, None], (self_keys, self_values), position, None, keys, mask, temperature, True
        )  # weights (B, L, H, 1, T)
        return (torch.log_softmax(logits[:, 0], -1), *state, weights[:, :, :, 0])


def step_graphs(model, artifact: Path, prefix: int, sizes: list[int], repeats: int) -> list[str]:
    """Time decoder_step.onnx against the every-layer step graph at each batch size."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    default = ort.InferenceSession(str(artifact / "decoder_step.onnx"), options)
    names = [i.name for i in default.get_inputs()]
    outputs = [o.name for o in default.get_outputs()]
    src = torch.randint(4, model.config.source_vocab_size, (2, 12))
    src[:, -1] = 2
    traced = step_inputs(model, src, torch.tensor([12, 12]), 1.0, prefix)
    every = to_onnx(_StepEveryLayer(model), traced, names, outputs)
    every = ort.InferenceSession(every.SerializeToString(), options)
    lines = []
    for size in sizes:
        src = torch.randint(4, model.config.source_vocab_size, (size, 12))
        src[:, -1] = 2
        args = step_inputs(model, src, torch.full((size,), 12), 1.0, prefix)
        feeds = {n: a.numpy() for n, a in zip(names, args, strict=True)}
        times = best_of(
            repeats * 20,
            {
                "default": lambda f=feeds: default.run(None, f),
                "every": lambda f=feeds: every.run(None, f),
            },
        )
        lines.append(
            f"| {size} | {1e3 * times['default']:.3f} | {1e3 * times['every']:.3f} | "
            f"{times['every'] / times['default']:.2f}x |"
        )
    return lines


def carried_weights(artifact: Path, sources: list[str], size: int, factor: int, repeats: int):
    """The step-graph search with weights ``factor`` times wider at every step, against as is."""
    runtime = serving.load(artifact, device="cpu", intra_op_num_threads=1, decode_graph=False)
    backend, step = runtime.backend, runtime.backend.step

    def wide(y_prev, carry, position, temperature):
        log_probs, carry, weights = step(y_prev, carry, position, temperature)
        return log_probs, carry, np.tile(weights, (1, factor))  # (N, factor * T)

    translator = runtime.translator
    ids = translator.source_ids([list(text) for text in sources[:size]])
    lines = []
    for beam_size in (1, 5):
        settings = dataclasses.replace(runtime.search_settings(), beam_size=beam_size)

        def run(step_fn, settings=settings):
            def go() -> None:
                backend.step = step_fn
                translator.decode(ids, settings)

            return go

        t = best_of(repeats, {"as is": run(step), "wide": run(wide)})
        lines.append(
            f"| {beam_size} | {1e3 * t['as is']:.1f} | {1e3 * t['wide']:.1f} | "
            f"{t['wide'] / t['as is']:.2f}x |"
        )
    backend.step = step
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    X, y = reversal(2000, seed=0)
    model = Seq2Seq(
        encoder="transformer",
        decoder="transformer",
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        max_steps=args.train_steps,
        max_epochs=1000,
        early_stopping=False,
        learning_rate=3e-3,
        device="cpu",
        n_threads=1,
        random_state=0,
    ).fit(X, y)
    sources, targets = reversal(args.n_inputs, seed=1)
    print(
        f"Transformer {args.layers} layers x {args.heads} heads, hidden {args.hidden}, "
        f"{args.train_steps} steps: exact match {model.score(sources, targets):.3f} on "
        f"{len(sources)} inputs of 4-12 characters"
    )
    with tempfile.TemporaryDirectory() as tmp:
        artifact = model.export_onnx(Path(tmp) / "model")
        runtime = serving.load(artifact, device="cpu", intra_op_num_threads=1)
        expected = model.predict_attention(sources, layer=0, head=1)
        got = runtime.predict_attention(sources, layer=0, head=1)
        gap = max(float(np.abs(a - b).max()) for a, b in zip(expected, got, strict=True) if a.size)
        print(f"runtime vs estimator, layer 0 head 1: max |difference| {gap:.1e}\n")
        print("| chunk | predict ms | default ms | one head ms | all ms | one head / default "
              "| all / default |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for size in args.batch_sizes:
            runs = {
                "predict": chunked(runtime, sources, size),
                "default": chunked(runtime, sources, size, with_attention=True),
                "one": chunked(runtime, sources, size, with_attention=True, layer=0, head=1),
                "all": chunked(
                    runtime, sources, size, with_attention=True, layer="all", head="all"
                ),
            }
            t = best_of(args.repeats, runs)
            print(
                f"| {size} | {1e3 * t['predict']:.1f} | {1e3 * t['default']:.1f} | "
                f"{1e3 * t['one']:.1f} | {1e3 * t['all']:.1f} | {t['one'] / t['default']:.2f}x "
                f"| {t['all'] / t['default']:.2f}x |"
            )
        print(f"\nThe alternative: one decoder step, cache of {args.prefix}, source length 12")
        print("| batch | decoder_step.onnx ms | + every layer's weights ms | ratio |")
        print("|---|---|---|---|")
        for line in step_graphs(
            model.module_, artifact, args.prefix, args.batch_sizes, args.repeats
        ):
            print(line)
        size, factor = max(args.batch_sizes), args.layers * args.heads
        print(f"\nCarrying every step's weights x{factor} through the search, chunk of {size}")
        print("| beam | search ms | weights x layers x heads ms | ratio |")
        print("|---|---|---|---|")
        for line in carried_weights(artifact, sources, size, factor, args.repeats):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
