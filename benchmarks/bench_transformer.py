"""The Transformer families side by side with the recurrent ones, in one run (issue 18).

1. Training tokens/s (forward + backward + Adam, the whole model) of a Transformer encoder
   against the bi-GRU encoder at equal parameter count: both under the same Luong decoder
   (no input feeding), the Transformer's ``ffn_size`` chosen to match the GRU model's count.
2. The Luong decoder (general score) without input feeding over a Transformer encoder: the
   parallel teacher-forced path (``forward``) against the same model one step at a time
   (``forward_stepwise``), whole model, with GRU and with LSTM cells (torch runs a whole LSTM
   sequence through oneDNN, a GRU step by step); the same decoder over the bi-GRU encoder; and
   the Transformer decoder over the Transformer encoder.
   Sections 1 and 2 run once per ``--precisions`` (float32, then bfloat16 mixed precision, as
   ``Seq2Seq(precision=...)`` trains), then print the bfloat16 / float32 ratios and section 2
   with each path at its faster precision.
3. Decode items/s of a briefly fitted Transformer (encoder and decoder, key-value cache):
   ``Seq2Seq.predict`` (torch) against ``serving.load(...).predict`` (onnxruntime) at batch 1,
   16, 64 and 256; both must give identical predictions.
4. One cached decoder step at prefixes 5, 20 and 50 (torch, batch 64): its cost grows with
   the prefix linearly (the attention reads ``t`` cached rows), not quadratically.

    python benchmarks/bench_transformer.py            # full run (a few minutes)
    python benchmarks/bench_transformer.py --quick    # seconds, tiny sizes
    python benchmarks/bench_transformer.py --sections 2 --batch-size 32 --length 40
    python benchmarks/bench_transformer.py --sections 2 --hidden-size 256 --num-layers 2 \
        --length 8 --vocab-size 42                      # G2P-size models
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_infer import best_times, chunks  # noqa: E402
from bench_train import reversal_batch, tokens_per_second  # noqa: E402
from machine import describe  # noqa: E402

import serving  # noqa: E402
from skattn import Seq2Seq  # noqa: E402
from skattn.datasets import make_reversal  # noqa: E402
from skattn.models import ModelConfig, Seq2SeqModule  # noqa: E402

TRANSFORMER = dict(encoder="transformer", decoder="transformer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--batch-size", type=int, default=64, help="training batch")
    parser.add_argument("--length", type=int, default=20, help="training source tokens")
    parser.add_argument("--vocab-size", type=int, default=30)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=1, help="training models' layers")
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="training steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-inputs", type=int, default=512, help="sources to decode")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--prefixes", type=int, nargs="+", default=[5, 20, 50])
    parser.add_argument("--threads", type=int, default=1, help="torch and onnxruntime threads")
    parser.add_argument("--precisions", nargs="+", choices=("float32", "bfloat16"),
                        default=["float32", "bfloat16"],
                        help="training's products (sections 1 and 2, each in turn)")  # fmt: skip
    parser.add_argument("--sections", type=int, nargs="+", choices=(1, 2, 3, 4),
                        default=[1, 2, 3, 4], help="which of the four tables")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.length, args.hidden_size, args.num_heads = 8, 6, 16, 2
        args.steps, args.repeats, args.n_inputs, args.batch_sizes = 1, 1, 32, [1, 16]
        args.prefixes = [2, 4]
    return args


def n_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def build(args, **options) -> Seq2SeqModule:
    torch.manual_seed(0)
    sizes = dict(hidden_size=args.hidden_size, num_layers=args.num_layers)
    config = ModelConfig(args.vocab_size, args.vocab_size, **sizes, **options)
    return Seq2SeqModule(config)


def equal_size_transformer_encoder(args, target: int, decoder: dict) -> tuple[dict, int]:
    """The Transformer encoder options whose whole model is closest to ``target`` parameters."""
    best = None
    for ffn_size in range(16, 16 * args.hidden_size + 1, 16):
        options = dict(encoder="transformer", num_heads=args.num_heads, ffn_size=ffn_size)
        count = n_parameters(build(args, **options, **decoder))
        if best is None or abs(count - target) < abs(best[1] - target):
            best = (options, count)
    return best


def training_rows(args) -> None:
    """Tables 1 and 2 (as ``--sections`` names them), once per precision, then the bfloat16
    speed-ups when both ran."""
    rates = {precision: training_tables(args, precision) for precision in args.precisions}
    if len(rates) < 2:
        return
    print("\n## training tokens/s, bfloat16 / float32 (mixed precision, the same steps)")
    print("| model | bfloat16 / float32 |")
    print("|---|---:|")
    for label, rate in rates["float32"].items():
        print(f"| {label} | {rates['bfloat16'][label] / rate:.2f}x |")
    if 2 not in args.sections:
        return
    print(
        "\n## 2. parallel against the step loop, each at its faster precision (the step "
        "loop's single-row products gain least from bfloat16: it is timed as it runs best)"
    )
    print("| model | parallel | step loop | speed-up |")
    print("|---|---|---|---:|")
    for label in [
        key[: -len(", parallel")] for key in rates["float32"] if key.endswith("parallel")
    ]:
        fast = {
            path: max(rates, key=lambda precision: rates[precision][f"{label}, {path}"])
            for path in ("parallel", "step loop")
        }
        ratio = (
            rates[fast["parallel"]][f"{label}, parallel"]
            / rates[fast["step loop"]][f"{label}, step loop"]
        )
        print(f"| {label[3:]} | {fast['parallel']} | {fast['step loop']} | {ratio:.2f}x |")


def training_tables(args, precision: str) -> dict[str, float]:
    """Tables 1 and 2 with the forward products in ``precision``; their tokens/s by row."""
    batch = reversal_batch(args.batch_size, args.length, args.vocab_size, torch.Generator())
    timing = dict(steps=args.steps, repeats=args.repeats, precision=precision)
    out = {}
    luong = dict(decoder="luong", input_feeding=False, scorer="general")
    gru = build(args, **luong)
    options, count = equal_size_transformer_encoder(args, n_parameters(gru), luong)
    transformer = build(args, **options, **luong)
    if 1 in args.sections:
        print(
            f"\n## 1. training tokens/s, batch {args.batch_size}, target length "
            f"{args.length + 1}, {precision}"
        )
        print("| encoder (Luong decoder, no input feeding) | parameters | tokens/s |")
        print("|---|---:|---:|")
        rates = {}
        for label, model in (
            ("bi-GRU", gru),
            (f"Transformer (ffn {options['ffn_size']})", transformer),
        ):
            rates[label] = out[f"1. {label}"] = tokens_per_second(model, batch, **timing)
            print(f"| {label} | {n_parameters(model):,} | {rates[label]:,.0f} |")
        gru_rate, transformer_rate = rates.values()
        size_ratio = count / n_parameters(gru)
        print(
            f"Transformer / bi-GRU: {transformer_rate / gru_rate:.2f}x "
            f"(parameters {size_ratio:.3f}x)"
        )
    if 2 not in args.sections:
        return out

    print(
        f"\n## 2. parallel teacher forcing against the step loop, batch {args.batch_size}, "
        f"target length {args.length + 1}, {precision}"
    )
    print(
        "| model | parallel tokens/s | stepwise tokens/s | speed-up | decoder alone speed-up "
        "| encoder share (parallel) | ceiling |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    tokens = batch[3].numel()
    for label, model in (
        ("Transformer encoder + Luong (no input feeding)", transformer),
        ("the same with LSTM cells", build(args, **options, **luong, cell="lstm")),
        ("bi-GRU encoder + Luong (no input feeding)", gru),
        ("Transformer encoder + decoder", build(args, **TRANSFORMER, num_heads=args.num_heads)),
    ):
        rate = {
            (alone, stepwise): tokens_per_second(
                model, batch, stepwise=stepwise, decoder_only=alone, **timing
            )
            for alone in (False, True)
            for stepwise in (False, True)
        }
        seconds = {key: tokens / value for key, value in rate.items()}  # per training step
        # The encoder's forward and backward are the same in both paths: even a decoder that
        # cost nothing leaves the whole model at most (encoder + stepwise decoder) / encoder.
        encoder = max(seconds[False, False] - seconds[True, False], 1e-12)
        ceiling = (encoder + seconds[True, True]) / encoder
        print(
            f"| {label} | {rate[False, False]:,.0f} | {rate[False, True]:,.0f} | "
            f"{rate[False, False] / rate[False, True]:.2f}x | "
            f"{rate[True, False] / rate[True, True]:.2f}x | "
            f"{encoder / seconds[False, False]:.0%} | {ceiling:.1f}x |"
        )
        out[f"2. {label}, parallel"] = rate[False, False]
        out[f"2. {label}, step loop"] = rate[False, True]
    return out


def fitted_transformer(args) -> Seq2Seq:
    """A Transformer (encoder and decoder, 2 layers) fitted briefly on reversal of 4-16 chars."""
    X, y = make_reversal(2000, 4, 16, random_state=0)
    return Seq2Seq(
        **TRANSFORMER,
        hidden_size=args.hidden_size,
        num_heads=args.num_heads,
        num_layers=2,
        max_steps=20 if args.quick else 150,
        learning_rate=3e-3,
        early_stopping=False,
        device="cpu",
        n_threads=args.threads,  # fit and predict (predict sets torch's threads to it)
        random_state=0,
    ).fit(X, y)


def decode_rows(args) -> Seq2Seq:
    """Table 3; returns the fitted model (table 4 steps it)."""
    sources, _ = make_reversal(args.n_inputs, 4, 16, random_state=1)
    start = time.perf_counter()
    estimator = fitted_transformer(args)
    fit_seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as directory:
        path = estimator.export_onnx(os.path.join(directory, "model"))
        runtime = serving.load(
            path,
            device="cpu",
            intra_op_num_threads=args.threads,
            max_batch_size=max(args.batch_sizes),  # a row's batch is one chunk
        )
    print(
        f"\n## 3. decode items/s, greedy with the key-value cache: {args.n_inputs} sources of "
        f"4-16 chars, Transformer d={args.hidden_size}, 2 layers, {args.num_heads} heads, "
        f"fitted {fit_seconds:.0f}s"
    )
    print("| batch | torch items/s | onnxruntime items/s | onnxruntime / torch |")
    print("|---:|---:|---:|---:|")
    predictors = {"torch": estimator.predict, "onnxruntime": runtime.predict}
    for batch_size in args.batch_sizes:
        seconds, outputs = best_times(predictors, chunks(sources, batch_size), args.repeats)
        if outputs["torch"] != outputs["onnxruntime"]:
            raise SystemExit(f"batch {batch_size}: torch and onnxruntime predictions differ")
        torch_rate, ort_rate = (args.n_inputs / seconds[name] for name in predictors)
        print(
            f"| {batch_size} | {torch_rate:,.0f} | {ort_rate:,.0f} | {ort_rate / torch_rate:.2f}x |"
        )
    return estimator


@torch.inference_mode()
def step_rows(args, module: Seq2SeqModule) -> None:
    """Median time of one cached step after ``t`` target positions, batch 64, source 16."""
    module.eval()
    B, T = 64, 16
    src = torch.randint(4, module.config.source_vocab_size, (B, T))
    memory, keys, mask, state = module.encode(src, torch.full((B,), T))
    y = torch.full((B,), 4)
    one = torch.tensor(1.0)
    times, t = {}, 0
    for prefix in sorted(args.prefixes):
        while t < prefix:
            _, state, _ = module.step(y, state, memory, keys, mask, one, torch.tensor(t))
            t += 1
        samples = []
        for _ in range(max(5, 10 * args.repeats)):
            start = time.perf_counter()
            module.step(y, state, memory, keys, mask, one, torch.tensor(t))
            samples.append(time.perf_counter() - start)
        times[prefix] = sorted(samples)[len(samples) // 2]
    first = min(times)
    print(f"\n## 4. one cached decoder step (torch, batch {B}, source {T})")
    print("| prefix t | step (ms) | / at first prefix | prefix ratio |")
    print("|---:|---:|---:|---:|")
    for prefix, seconds in times.items():
        print(
            f"| {prefix} | {1e3 * seconds:.3f} | {seconds / times[first]:.2f}x | "
            f"{prefix / first:.0f}x |"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"# {describe()}\n# torch {torch.__version__}, {args.threads} thread(s); "
        "d_model = hidden_size = "
        f"{args.hidden_size}; median (training) or best (decode) of {args.repeats}"
    )
    if {1, 2} & set(args.sections):
        training_rows(args)
    if {3, 4} & set(args.sections):
        estimator = decode_rows(args) if 3 in args.sections else None
        if 4 in args.sections:
            step_rows(args, (estimator or fitted_transformer(args)).module_)


if __name__ == "__main__":
    main()
