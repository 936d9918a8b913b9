"""TF32 against full float32 products on CUDA: the answers and the speed of one artifact.

onnxruntime's CUDA provider multiplies float32 matrices in TF32 unless ``use_tf32=0``;
:func:`serving.sessions.cuda_provider_options` turns it off. This script serves one artifact on
CUDA both ways, step-wise and with ``decode.onnx``, and prints for each: how many of 2,048
reversal inputs (lengths 4-12, ``random_state=1``) are answered differently from the CPU
runtime, how many of the first 512 differ between a batch of one and the batched call, and
items/s at batch 64 and 256 (three passes each after a warm-up batch).

    python benchmarks/bench_cuda_tf32.py MODEL_DIR   # e.g. after gpu_check.sh --keep=DIR

Needs onnxruntime-gpu and a CUDA device. Results: ``benchmarks/results/gpu_check_h200.txt``.
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import serving
from serving import sessions
from skattn.datasets import make_reversal


def provider_options(tf32: bool):
    def options(device_id: int) -> dict[str, str]:
        return {**sessions.cuda_provider_options(device_id), "use_tf32": "1" if tf32 else "0"}

    return options


def items_per_second(runtime, sources: list[str], batch: int, passes: int = 3) -> float:
    runtime.predict(sources[:batch])  # warm-up: kernels, arenas
    start = time.perf_counter()
    for _ in range(passes):
        for i in range(0, len(sources), batch):
            runtime.predict(sources[i : i + batch])
    return passes * len(sources) / (time.perf_counter() - start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="an exported artifact (float32)")
    args = parser.parse_args(argv)
    sources, _ = make_reversal(2048, min_length=4, max_length=12, random_state=1)
    on_cpu = serving.load(args.model_dir, device="cpu", decode_graph=False).predict(sources)
    for tf32 in (False, True):
        with mock.patch.object(sessions, "cuda_provider_options", provider_options(tf32)):
            for graph in (False, True):
                runtime = serving.load(args.model_dir, device="cuda", decode_graph=graph)
                batched = runtime.predict(sources)
                alone = [runtime.predict([source])[0] for source in sources[:512]]
                rates = [items_per_second(runtime, sources, batch) for batch in (64, 256)]
                off_cpu = sum(a != b for a, b in zip(batched, on_cpu, strict=True))
                off_batch = sum(a != b for a, b in zip(alone, batched[:512], strict=True))
                print(
                    f"use_tf32={int(tf32)} {'decode.onnx' if graph else 'steps':<11}: "
                    f"{off_cpu} of {len(sources)} differ "
                    f"from the CPU, {off_batch} of 512 "
                    f"batch-of-one differ from batched; items/s at 64: {rates[0]:,.0f}, "
                    f"at 256: {rates[1]:,.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
