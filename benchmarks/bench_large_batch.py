"""Large-batch training: does a larger batch, with its learning rate scaled and warmed up, hold
the accuracy of the default batch for the same number of training examples, in less time?

The seeds' experiment (``bench_defaults.run``: a bi-GRU of 128 units, Bahdanau attention, digit
strings of lengths 1-12, every other hyperparameter at the estimator's default) trained on the
same number of examples (``--examples``, one pass over fresh strings) at batch 64, the default,
and at larger batches with the rate kept, scaled by the square root of the batch ratio, or
scaled linearly (Goyal et al. 2017), with a linear warmup (``warmup_steps``) and the default
cosine decay. Greedy exact match on 500 new strings of length 8 and 12; wall-clock seconds per
fit. The rows run round-robin over the random states, so that a change in the machine's speed
falls on all of them alike.

    python benchmarks/bench_large_batch.py                  # 5 random states, 1 thread
    python benchmarks/bench_large_batch.py --random-states 0 --examples 4000   # a quick look

Measured (random state 0, 16,000 examples, 1 thread on a core shared with other jobs):

    batch 64 (default)                         EM@8 0.998  EM@12 0.798  198.9 s
    batch 256, same rate                       EM@8 0.024  EM@12 0.000  106.5 s  (1.87x)
    batch 256, rate x2 (sqrt), warmup 10%      EM@8 0.410  EM@12 0.000  141.1 s  (1.41x)
    batch 256, rate x4 (linear), warmup 10%    EM@8 0.052  EM@12 0.000  131.6 s  (1.51x)
    batch 512, rate x2.8 (sqrt), warmup 10%    EM@8 0.000  EM@12 0.000  160.7 s  (1.24x)

So on this task, at this budget, a larger batch does not hold the accuracy: 250 steps of 64
learn the task, 63 steps of 256 do not, whatever the rate (the square-root scaling with warmup
comes closest), and a step of 256 costs 2.1-3x a step of 64 on one CPU thread, so the time
saved is 1.2-1.9x, not 4x. Warmup and the scaled rate are there (``warmup_steps``,
``learning_rate``) for budgets measured in epochs with spare steps, where large batches are
known to hold (Goyal et al.); on a CPU the default batch of 64 learns more per second.
"""

from __future__ import annotations

import argparse
import math
import statistics

import bench_defaults
import machine
import torch

BASE_BATCH, BASE_LR = 64, 3e-3

#: (label, batch size, learning rate, warmup as a share of the steps)
ROWS = (
    ("batch 64 (default)", 64, BASE_LR, 0.0),
    ("batch 256, same rate", 256, BASE_LR, 0.0),
    ("batch 256, rate x2 (sqrt), warmup 10%", 256, 2 * BASE_LR, 0.1),
    ("batch 256, rate x4 (linear), warmup 10%", 256, 4 * BASE_LR, 0.1),
    ("batch 512, rate x2.8 (sqrt), warmup 10%", 512, math.sqrt(8) * BASE_LR, 0.1),
)


def run(batch: int, lr: float, warmup: float, examples: int, random_state: int) -> tuple:
    """Exact match at length 8 and 12, and the training seconds, of one fit."""
    steps = math.ceil(examples / batch)
    params = dict(batch_size=batch, learning_rate=lr, max_steps=steps)
    return bench_defaults.run(
        params | {"warmup_steps": round(warmup * steps)}, random_state, examples
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=BASE_BATCH * 250, help="per fit")
    parser.add_argument("--random-states", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    machine.use_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.examples} examples a fit")
    results: dict[str, list] = {label: [] for label, *_ in ROWS}
    for random_state in args.random_states:
        for label, batch, lr, warmup in ROWS:
            em8, em12, seconds = run(batch, lr, warmup, args.examples, random_state)
            results[label].append((em8, em12, seconds))
            print(f"{label:<44} rs={random_state} EM@8 {em8:.3f} EM@12 {em12:.3f} {seconds:.1f} s")
    base = statistics.mean(r[2] for r in results[ROWS[0][0]])
    print(
        "\n| configuration | EM@8 per random state | min EM@8 | mean EM@12 | s per fit | speed-up |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for label, rows in results.items():
        em8 = [r[0] for r in rows]
        seconds = statistics.mean(r[2] for r in rows)
        print(
            f"| {label} | {' '.join(f'{e:.2f}' for e in em8)} | {min(em8):.3f} | "
            f"{statistics.mean(r[1] for r in rows):.3f} | {seconds:.1f} | {base / seconds:.2f}x |"
        )


if __name__ == "__main__":
    main()
