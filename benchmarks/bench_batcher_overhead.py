"""The dynamic batcher's own cost per one-item request, at max_batch_size 64 against 1.

At concurrency 1 a batch is one item, and the server runs the same code whatever its
``--max-batch-size``; this measures that claim without HTTP, a model or a second process. One
client coroutine sends ``--requests`` one-item requests, one after the other, through
:class:`serving.batcher.Batcher` (eager, as the server runs it) over a runtime that answers at
once, so what is timed is the queue, the scheduling task and the hop to the inference thread.
The two sizes take turns at going first over ``--repeats`` runs; the medians are printed with
their ratio.

    python benchmarks/bench_batcher_overhead.py          # about 20 s
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from serving.batcher import Batcher

try:
    import uvloop
except ImportError:  # pragma: no cover - uvicorn[standard] brings it
    uvloop = None


class InstantRuntime:
    """A runtime that answers at once: the reversed sources, no attention."""

    def predict_batch(self, sources, temperature=None, with_attention=False, **_):
        return [source[::-1] for source in sources], None


async def one_run(max_batch_size: int, requests: int) -> tuple[float, float]:
    """(CPU, wall) microseconds per request."""
    batcher = Batcher(InstantRuntime(), max_batch_size=max_batch_size, eager=True)
    await batcher.start()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(requests):
        with batcher.receiving():
            futures = batcher.submit(["abcdefgh"])
        (result,) = await batcher.results(futures)
        if result.prediction != "hgfedcba":
            raise SystemExit(f"wrong answer: {result.prediction!r}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await batcher.stop()
    return 1e6 * cpu / requests, 1e6 * wall / requests


async def measure(args: argparse.Namespace) -> dict[int, list[tuple[float, float]]]:
    sizes = (64, 1)
    runs: dict[int, list[tuple[float, float]]] = {size: [] for size in sizes}
    for repeat in range(args.repeats):
        for size in sizes if repeat % 2 == 0 else sizes[::-1]:
            runs[size].append(await one_run(size, args.requests))
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.repeats < 1:
        parser.error("--requests and --repeats must be >= 1")
    runs = (uvloop.run if uvloop is not None else asyncio.run)(measure(args))
    cpu = {size: statistics.median(r[0] for r in rows) for size, rows in runs.items()}
    wall = {size: statistics.median(r[1] for r in rows) for size, rows in runs.items()}
    print(f"{'max_batch_size':>14} {'cpu us/request':>14} {'wall us/request':>15}")
    for size in runs:
        print(f"{size:14d} {cpu[size]:14.1f} {wall[size]:15.1f}")
    print(f"64 / 1: cpu {cpu[64] / cpu[1]:.2f}x  wall {wall[64] / wall[1]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
