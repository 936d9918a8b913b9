"""Data parallelism as a lever for the G2P hour: two training processes of one thread each,
their gradients summed over ``torch.distributed`` (gloo, 127.0.0.1), against one process with
two torch threads, side by side on the same CMUdict batches.

Issue 16's single-model goal is bounded by the optimizer steps that fit in an hour on 2 cores,
and one process uses its second core through torch's intra-op threads, which split each small
product of a recurrent step in two (a bi-GRU 256 step at batch 64 gains about 1.3x from the
second thread). Two processes of one thread each, every one computing half of each batch, would
keep both cores on whole products; the price is one all-reduce of the gradients per step.

Each row trains the two-layer G2P model (``examples/g2p_cmudict.py --num-layers 2``: bi-GRU
256, Bahdanau decoder, additive attention, dropout 0.3) through ``Seq2Seq.fit`` with its
``Trainer.train_step`` replaced by one that, in the two-process rows, computes the summed loss
of the rank's half of the batch (the same length-sorted global batches on both ranks, so their
halves are about as long), divides by the global batch's token count (one all-reduce of a
scalar) and sums the gradients (one all-reduce of a flat buffer): the update of the global
batch's mean loss, as one process would compute it. The run checks that the two ranks end with
the same weights. Prints milliseconds per training example (wall time of the timed steps), the
all-reduce's share, and the ratio to one process with two threads at the same global batch.

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


def model_params(quick: bool) -> dict:
    size = (
        dict(embedding_dim=16, hidden_size=32) if quick else dict(embedding_dim=64, hidden_size=256)
    )
    return dict(decoder="bahdanau", scorer="additive", num_layers=2, dropout=0.3, **size)


def parallel_step(rank: int, world: int, seconds: list, reduce_seconds: list):
    """A ``Trainer.train_step`` that trains on ``batch[rank::world]`` and sums the gradients."""

    def train_step(trainer, batch):
        start = time.perf_counter()
        trainer.module.train()
        trainer.optimizer.zero_grad(set_to_none=True)
        loss, n_tokens = trainer.batch_loss(batch[rank::world], trainer.label_smoothing)
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


def worker(rank, world, threads, batch, port, steps, warmup, quick, results):
    """One rank: fit ``warmup + steps`` steps; rank 0 reports its timings, every rank a
    checksum of its final weights."""
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
            **model_params(quick),
            batch_size=batch,
            lr_schedule="cosine",
            max_steps=warmup + steps,
            early_stopping=False,
            random_state=0,
            n_threads=threads,
        ).fit(X, y)
    with torch.no_grad():
        weights = float(sum(p.double().abs().sum() for p in model.module_.parameters()))
    results.put((rank, np.mean(seconds[warmup:]), np.mean(reduce_seconds[warmup:]), weights))
    if world > 1:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(world, threads, batch, steps, warmup, quick):
    """(seconds per step, all-reduce seconds per step) of rank 0; the ranks' weights agree."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    args = (world, threads, batch, port, steps, warmup, quick, results)
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
    reports.sort()
    for process in processes:
        process.join()
    checksums = [weights for *_, weights in reports]
    if max(checksums) - min(checksums) > 1e-6 * abs(checksums[0]):
        raise AssertionError(f"the ranks' weights differ: {checksums}")
    return reports[0][1], reports[0][2]


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
        raise SystemExit("needs 2 usable cores")
    print(machine.describe())
    print(
        f"torch {torch.__version__}; the two-layer G2P model"
        f"{' (small: --quick)' if args.quick else ''}; {args.steps} timed steps after "
        f"{args.warmup}, mean per round, median of {args.repeats} rounds; wall time"
    )
    times: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(ROWS))}
    for _ in range(args.repeats):  # round-robin, so that a slow spell hits every row alike
        for i, (_, world, threads, batch) in enumerate(ROWS):
            times[i].append(measure(world, threads, batch, args.steps, args.warmup, args.quick))
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
