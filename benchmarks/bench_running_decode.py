"""The decode alone, per item: ``decode.onnx`` against the step graphs, batched whole
(``Translator``) and as a running set (``serving.running.RunningDecode``, what continuous
batching steps), on one core and one onnxruntime thread, side by side in one run.

What it shows: the price of the step graphs that continuous batching needs (one ``session.run``
per step, the search's Python between steps) against the one call of ``decode.onnx`` that
dynamic batching makes. The model is ``bench_server``'s reversal model (trained here, a few
seconds), or ``--model-dir``; sources are 8 random letters.

    python benchmarks/bench_running_decode.py
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def per_item_ms(run, items: int, repeats: int, rounds: int = 5) -> float:
    """The median over ``rounds`` of the mean time of ``run()`` per item, in ms."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        times.append((time.perf_counter() - start) / repeats / items)
    return 1000 * statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pinned = hasattr(os, "sched_setaffinity")
    cores = os.sched_getaffinity(0) if pinned else None
    if pinned:  # one core, given back at the end (a caller's later children would inherit it)
        os.sched_setaffinity(0, {sorted(cores)[0]})
    try:
        return run(args)
    finally:
        if pinned:
            os.sched_setaffinity(0, cores)


def run(args: argparse.Namespace) -> int:
    """The table, on the core ``main`` pinned."""
    import serving
    from serving.running import RunningDecode

    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model_dir
        if model_dir is None:
            from bench_server import train_reversal_model

            model_dir = train_reversal_model(Path(scratch) / "reversal", args.seed)
        runtime = serving.load(model_dir, device="cpu", intra_op_num_threads=1)
        if not runtime.decode_graph:
            sys.exit(f"{model_dir} holds no decode.onnx")
        rng = random.Random(args.seed)
        settings = runtime.search_settings()
        print(f"{'batch':>5}  {'decode.onnx':>12}  {'step graphs':>12}  {'running set':>12}  "
              f"{'steps / graph':>13}  {'running / graph':>15}   (ms per item)")  # fmt: skip
        for n in args.batch_sizes:
            sources = ["".join(rng.choices("abcdefghij", k=8)) for _ in range(n)]
            tokens = [list(s) for s in sources]
            assert (
                runtime.predict(sources) == runtime.step_translator.translate(tokens, settings)[0]
            )

            def running(sources=sources):
                decode = RunningDecode(runtime, None)
                decode.admit(list(range(len(sources))), sources)
                while decode.size:
                    decode.step()

            repeats = max(2, 200 // n)
            graph = per_item_ms(lambda s=sources: runtime.predict(s), n, repeats)
            steps = per_item_ms(
                lambda t=tokens: runtime.step_translator.translate(t, settings), n, repeats
            )
            run = per_item_ms(running, n, repeats)
            print(f"{n:>5}  {graph:>12.3f}  {steps:>12.3f}  {run:>12.3f}  {steps / graph:>12.2f}x"
                  f"  {run / graph:>14.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
