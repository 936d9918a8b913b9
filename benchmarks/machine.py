"""Which CPU a benchmark ran on (its model name and the vector extensions that move the figures),
and how many torch threads it trains and predicts with.

The same "2-core machine" has come as different hosts: sessions have run on one without VNNI
(AVX2 int8 products) and on one with AVX-512 VNNI and AMX, where the int8 G2P member decodes
about twice as fast. A figure without its host cannot be compared with another, so the
benchmarks print :func:`describe` in their headers.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from skattn.core.checks import usable_cores

__all__ = ["FLAGS", "cpu_flags", "describe", "use_threads"]

#: The ``/proc/cpuinfo`` flags that change what onnxruntime's and torch's kernels can use: wider
#: vectors, int8 dot products (VNNI), bfloat16 and the AMX tile units.
FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_int8",
)


def cpu_flags(cpuinfo: str) -> tuple[str, str]:
    """``(model name, the FLAGS present in order)`` from the text of ``/proc/cpuinfo``."""
    model, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, " ".join(f for f in FLAGS if f in flags)


def describe(cpuinfo_path: str | Path = "/proc/cpuinfo") -> str:
    """One line: the CPU's model, its relevant vector extensions and the usable cores."""
    try:
        model, flags = cpu_flags(Path(cpuinfo_path).read_text())
    except OSError:  # not Linux: what the platform module knows
        model, flags = platform.processor() or platform.machine(), "unknown"
    return f"CPU: {model or 'unknown'}; ISA: {flags or 'none of ' + '/'.join(FLAGS)}; " + (
        f"{usable_cores()} usable cores"
    )


def use_threads(threads: int) -> None:
    """Run this process's torch work on ``threads`` threads, the estimator's fits and
    predictions included: ``torch.set_num_threads`` alone is not enough, since the estimator
    sets torch's threads to its ``n_threads`` for each call, and by default (``None``) that
    follows ``OMP_NUM_THREADS`` where it is set (``skattn.allotment``), else the usable cores."""
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
