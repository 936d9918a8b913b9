"""Time per decoder step of each scorer, with keys precomputed once vs recomputed every step.

One decoder step is ``Attention.forward`` for a single query ``s (B, d)`` over ``H (B, T, d)``
(score -> masked softmax -> context). "precomputed" reuses the keys made once per sentence by
``Attention.precompute``; "recomputed" calls ``precompute`` inside every step, as a decoder that
did not split the query-independent part would. The ratio is recomputed / precomputed.

Threads are pinned (``--threads``, default 1) so that the figures are reproducible on a shared
machine and compare the arithmetic, not the scheduler.

    python benchmarks/bench_scorers.py [--batch 64] [--length 30] [--dim 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from skattn.attention import SCORE_FUNCTIONS, Attention


def best_time_per_call(fns, repeats: int, number: int) -> list[float]:
    """Seconds per call of each function: the best over ``repeats`` of a ``number``-call mean.

    The functions are sampled in turn, so that a busy machine slows them alike; the minimum is
    the figure least disturbed by other processes (as ``timeit`` recommends).
    """
    for fn in fns:  # warm-up
        for _ in range(max(1, number // 4)):
            fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best[i] = min(best[i], (time.perf_counter() - start) / number)
    return best


def bench_scorer(name: str, B: int, T: int, d: int, repeats: int, number: int) -> list[float]:
    """Seconds per step ``[precomputed, recomputed]`` for the scorer ``name``."""
    gen = torch.Generator().manual_seed(0)
    att = Attention(name, d, d).eval()
    s = torch.randn(B, d, generator=gen)  # (B, d)
    H = torch.randn(B, T, d, generator=gen)  # (B, T, d)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    keys = att.precompute(H)  # (B, T, k), once per sentence

    def precomputed():
        return att(s, H, keys, mask)

    def recomputed():
        return att(s, H, att.precompute(H), mask)

    return best_time_per_call([precomputed, recomputed], repeats, number)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=30)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--number", type=int, default=50, help="steps per timing sample")
    parser.add_argument("--quick", action="store_true", help="few steps, for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.number = 3, 20

    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"B={args.batch}, T={args.length}, d={args.dim}, float32, best of {args.repeats} x "
        f"{args.number} steps"
    )
    header = f"{'scorer':<12}{'precomputed us/step':>22}{'recomputed us/step':>22}{'ratio':>8}"
    print(header)
    print("-" * len(header))
    with torch.inference_mode():
        for name in SCORE_FUNCTIONS:
            pre, re = bench_scorer(
                name, args.batch, args.length, args.dim, args.repeats, args.number
            )
            print(f"{name:<12}{pre * 1e6:>22.1f}{re * 1e6:>22.1f}{re / pre:>8.2f}")


if __name__ == "__main__":
    main()
