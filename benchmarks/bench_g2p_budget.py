"""What more compute the G2P example could get within its hour: seconds per training example of
the example's model on real CMUdict batches, for each lever that trades nothing in accuracy.

The G2P goal (issue 6: WER <= 23 % from one hour on 2 cores) is limited by how many optimizer
steps fit in the hour. This measures, side by side in one run, the example's default model
(``examples/g2p_cmudict.py``: bi-GRU 256, Bahdanau decoder, additive attention, batch 64)
against:

- larger batches (128, 256): fewer, larger matrix products per example;
- ``torch.compile`` of the decoder's recurrent step (the part that runs once per target
  position in Python), which fuses its element-wise work;
- bfloat16 autocast (on CPUs with native bf16 matrix units);
- the two-layer model (``--num-layers 2``), eager and compiled: what a larger model costs.

Each row trains through ``Seq2Seq.fit`` on the training words (length-bucketed shuffled batches,
dropout, Adam, the cosine schedule) and times the optimizer steps after a warm-up (which pays
``torch.compile``'s compilation). Wall-clock time with ``--threads`` torch threads: run it on an
idle machine. Prints the median milliseconds per training example over a few rounds (with their
spread), the speed-up over the default, and the epochs that 45 minutes of steps would hold.

    python benchmarks/bench_g2p_budget.py            # about 15 minutes on 2 cores
    python benchmarks/bench_g2p_budget.py --quick    # seconds: a small model, a few steps
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

import machine
import numpy as np
import torch

from skattn import Seq2Seq, training
from skattn.datasets import load_cmudict

#: (label, Seq2Seq overrides, compile the decoder step, bf16 autocast)
LEVERS = (
    ("default (batch 64)", {}, False, False),
    ("batch 128", {"batch_size": 128}, False, False),
    ("batch 256", {"batch_size": 256}, False, False),
    ("compiled decoder step", {}, True, False),
    ("bf16 autocast", {}, False, True),
    ("2 layers", {"num_layers": 2}, False, False),
    ("2 layers, compiled step", {"num_layers": 2}, True, False),
)
#: Minutes of optimizer steps in the example's 50-minute budget (90 % of it).
STEP_MINUTES = 45.0


@contextlib.contextmanager
def instrumented(compile_step: bool, bf16: bool):
    """Time every optimizer step of the fits in the block (the list it yields), optionally
    with the decoder's recurrent step compiled or the loss under bf16 autocast."""
    seconds: list[float] = []
    train_step, batch_loss = training.Trainer.train_step, training.Trainer.batch_loss

    def timed_train_step(trainer, batch):
        if compile_step and not hasattr(trainer, "compiled"):
            decoder = trainer.module.decoder
            decoder.recur = torch.compile(decoder.recur, dynamic=True)
            trainer.compiled = True
        start = time.perf_counter()
        result = train_step(trainer, batch)
        seconds.append(time.perf_counter() - start)
        return result

    def bf16_batch_loss(trainer, *args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return batch_loss(trainer, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(training.Trainer, "train_step", timed_train_step))
        if bf16:
            stack.enter_context(mock.patch.object(training.Trainer, "batch_loss", bf16_batch_loss))
        yield seconds


def measure(X, y, params: dict, compile_step: bool, bf16: bool, steps: int, warmup: int):
    """Mean seconds per training example over ``steps`` optimizer steps after ``warmup``."""
    model = Seq2Seq(**params, max_steps=warmup + steps, early_stopping=False, random_state=0)
    with instrumented(compile_step, bf16) as seconds:
        model.fit(X, y)
    return np.array(seconds[warmup:]).mean() / model.batch_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps (compilation)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all levers")
    parser.add_argument("--quick", action="store_true", help="a small model, a few steps")
    args = parser.parse_args(argv)
    machine.use_threads(args.threads)

    X, y = load_cmudict("train")
    base = dict(
        decoder="bahdanau",
        scorer="additive",
        embedding_dim=64,
        hidden_size=256,
        dropout=0.3,
        batch_size=64,
        lr_schedule="cosine",
    )
    levers = LEVERS
    if args.quick:
        X, y = X[:2000], y[:2000]
        base |= dict(embedding_dim=16, hidden_size=32)
        args.steps, args.warmup, args.repeats = 3, 2, 1
        levers = [lever for lever in LEVERS if not lever[2]]  # compilation takes too long
    epoch_items = len(X)
    has_bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()

    levers = [lever for lever in levers if has_bf16 or not lever[3]]
    print(machine.describe())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(X):,} training "
        f"pronunciations; {args.steps} timed steps after {args.warmup}, median of "
        f"{args.repeats} rounds (each lever once per round); wall time"
        + ("" if has_bf16 else "; no native bf16 on this CPU, so no bf16 row")
    )
    # Round-robin rounds, so that a slow spell of a shared machine hits every lever alike.
    times = {label: [] for label, *_ in levers}
    for _ in range(args.repeats):
        for label, overrides, compile_step, bf16 in levers:
            times[label].append(
                measure(X, y, base | overrides, compile_step, bf16, args.steps, args.warmup)
            )
    print(
        f"\n{'lever':<26}{'ms/example':>12}{'spread':>10}{'speed-up':>10}{'epochs in 45 min':>18}"
    )
    reference = statistics.median(times[levers[0][0]])
    for label, *_ in levers:
        seconds = statistics.median(times[label])
        spread = (max(times[label]) - min(times[label])) / seconds
        epochs = STEP_MINUTES * 60.0 / (seconds * epoch_items)
        print(
            f"{label:<26}{1000 * seconds:>12.3f}{spread:>9.0%} {reference / seconds:>9.2f}x"
            f"{epochs:>18.1f}"
        )


if __name__ == "__main__":
    main()
