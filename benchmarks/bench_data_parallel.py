"""Data parallelism as a lever for the G2P hour: two training processes of one thread each,
their gradients summed over ``torch.distributed`` (gloo, 127.0.0.1), against one process with
two torch threads, side by side on the same CMUdict batches.

Issue 16's single-model goal is bounded by the optimizer steps that fit in an hour on 2 cores,
and one process uses its second core through torch's intra-op threads, which split each small
product of a recurrent step in two (probes: the two-layer model's step at batch 64 took
203-210 ms on one thread and 132-155 ms on two, 1.3-1.6x). Two processes of one thread each,
every one computing half of each batch, would keep both cores on whole products; the price is
one all-reduce of the gradients per step.

Each row trains the two-layer G2P model (``examples/g2p_cmudict.py --num-layers 2``: bi-GRU
256, Bahdanau decoder, additive attention, dropout 0.3) through ``Seq2Seq.fit`` with its
``Trainer.train_step`` replaced by one that, in the two-process rows, computes the summed loss
of the rank's half of the batch (the same length-sorted global batches on both ranks, so their
halves are about as long), divides by the global batch's token count (one all-reduce of a
scalar) and sums the gradients (one all-reduce of a flat buffer): the update of the global
batch's mean loss, as one process would compute it (the replacement step leaves out
``precision="bfloat16"``'s autocast and the divergence check; the rows use neither). The run
checks that the two ranks end every row with the same weights, and first that two processes
make one process's update: a few steps of a small model without dropout from the same weights
and batches, one process against two, whose weights must agree to float rounding. Prints
milliseconds per training example (wall time of the timed steps), the all-reduce's share of a
step (both all-reduces, including the wait for the slower rank), and the ratio to one process
with two threads at the same global batch.

    python benchmarks/bench_data_parallel.py            # about 5 minutes on 2 cores
    python benchmarks/bench_data_parallel.py --quick    # seconds: a small model, a few steps
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import time
from unittest import mock

import machine
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from skattn import Seq2Seq, training
from skattn.datasets import load_cmudict

#: (label, processes, torch threads per process, global batch)
ROWS = (
    ("1 process x 2 threads", 1, 2, 64),
    ("2 processes x 1 thread", 2, 1, 64),
    ("1 process x 2 threads", 1, 2, 128),
    ("2 processes x 1 thread", 2, 1, 128),
)


def model_params(quick: bool, dropout: float = 0.3) -> dict:
    size = (
        dict(embedding_dim=16, hidden_size=32) if quick else dict(embedding_dim=64, hidden_size=256)
    )
    return dict(decoder="bahdanau", scorer="additive", num_layers=2, dropout=dropout, **size)


def parallel_step(rank: int, world: int, seconds: list, reduce_seconds: list):
    """A ``Trainer.train_step`` that trains on ``batch[rank::world]`` and sums the gradients."""

    def train_step(trainer, batch):
        start = time.perf_counter()
        trainer.module.train()
        trainer.optimizer.zero_grad(set_to_none=True)
        half = batch[rank::world]  # (a last batch of one item leaves the other rank nothing)
        if len(half):
            loss, n_tokens = trainer.batch_loss(half, trainer.label_smoothing)
        else:
            loss, n_tokens = sum(p.sum() for p in trainer.module.parameters()) * 0.0, 0
        reduce_start = time.perf_counter()
        total = torch.tensor(float(n_tokens))
        if world > 1:
            dist.all_reduce(total)
        reduced = time.perf_counter() - reduce_start
        (loss / total).backward()  # this rank's share of the global batch's mean loss
        if world > 1:
            reduce_start = time.perf_counter()
            grads = [p.grad for p in trainer.module.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])  # (P,)
            dist.all_reduce(flat)  # sum over ranks: the global batch's gradient
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
            reduced += time.perf_counter() - reduce_start
        if trainer.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(trainer.module.parameters(), trainer.max_grad_norm)
        trainer.optimizer.step()
        seconds.append(time.perf_counter() - start)
        reduce_seconds.append(reduced)
        return float(loss.detach()), n_tokens

    return train_step


def worker(rank, world, threads, batch, port, steps, warmup, quick, dropout, results):
    """One rank: fit ``warmup + steps`` steps; rank 0 reports its timings, every rank its
    final weights (flattened, float64)."""
    if world > 1:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    X, y = load_cmudict("train")
    if quick:
        X, y = X[:2000], y[:2000]
    seconds, reduce_seconds = [], []
    step = parallel_step(rank, world, seconds, reduce_seconds)
    with mock.patch.object(training.Trainer, "train_step", step):
        model = Seq2Seq(
            **model_params(quick, dropout),
            batch_size=batch,
            lr_schedule="cosine",
            max_steps=warmup + steps,
            early_stopping=False,
            random_state=0,
            n_threads=threads,
        ).fit(X, y)
    with torch.no_grad():
        weights = torch.cat([p.double().reshape(-1) for p in model.module_.parameters()])
    timings = np.mean(seconds[warmup:]), np.mean(reduce_seconds[warmup:])
    results.put((rank, *timings, weights.numpy()))
    if world > 1:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(world, threads, batch, steps, warmup, quick, dropout=0.3):
    """(seconds per step, all-reduce seconds per step, final weights) of rank 0; the ranks'
    weights must agree."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    args = (world, threads, batch, port, steps, warmup, quick, dropout, results)
    processes = [context.Process(target=worker, args=(rank, *args)) for rank in range(world)]
    for process in processes:
        process.start()
    reports = []
    while len(reports) < world:
        try:
            reports.append(results.get(timeout=5))
        except queue.Empty:
            failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if failed:
                for process in processes:
                    process.kill()
                raise SystemExit(f"a training process failed (exit codes {failed})") from None
    reports.sort(key=lambda report: report[0])
    for process in processes:
        process.join()
    for _, _, _, weights in reports[1:]:
        if not np.array_equal(weights, reports[0][3]):
            raise AssertionError("the ranks' weights differ: the gradients were not summed")
    return reports[0][1], reports[0][2], reports[0][3]


def check_update(steps: int = 5) -> float:
    """The largest weight difference, relative to the largest weight, after ``steps`` steps of
    one process and of two (the small model, dropout 0, the same initial weights and batches):
    float rounding if the two processes make one process's update."""
    one = measure(1, 2, 64, steps, 0, True, dropout=0.0)[2]
    two = measure(2, 1, 64, steps, 0, True, dropout=0.0)[2]
    return float(np.abs(one - two).max() / np.abs(one).max())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over all rows")
    parser.add_argument("--quick", action="store_true", help="a small model, a few steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.repeats = 4, 2, 1
    if len(os.sched_getaffinity(0)) < 2:
        print("skipped: two processes on one core measure nothing (needs 2 usable cores)")
        return
    print(machine.describe())
    difference = check_update()
    print(
        f"update check (small model, dropout 0, 5 steps): two processes' weights differ from "
        f"one process's by {difference:.1e} of the largest weight"
    )
    if difference > 1e-4:
        raise SystemExit("two processes do not make one process's update")
    print(
        f"torch {torch.__version__}; the two-layer G2P model"
        f"{' (small: --quick)' if args.quick else ''}; {args.steps} timed steps after "
        f"{args.warmup}, mean per round, median of {args.repeats} rounds; wall time"
    )
    times: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(ROWS))}
    for _ in range(args.repeats):  # round-robin, so that a slow spell hits every row alike
        for i, (_, world, threads, batch) in enumerate(ROWS):
            times[i].append(measure(world, threads, batch, args.steps, args.warmup, args.quick)[:2])
    print(f"\n{'row':<26}{'batch':>6}{'ms/example':>12}{'all-reduce':>12}{'vs 1 process':>14}")
    reference = {}
    for i, (label, _, _, batch) in enumerate(ROWS):
        step = statistics.median(t for t, _ in times[i])
        reduce = statistics.median(r for _, r in times[i])
        per_example = step / batch
        reference.setdefault(batch, per_example)
        print(
            f"{label:<26}{batch:>6}{1000 * per_example:>12.3f}{reduce / step:>11.0%} "
            f"{reference[batch] / per_example:>12.2f}x"
        )


if __name__ == "__main__":
    main()
