"""One Adam step over a ``Seq2SeqModule``'s parameters: torch's per-tensor loop, its ``foreach``
form, and the fused kernel that ``skattn.training.adam`` (what ``Seq2Seq.fit`` steps) asks for.

On the CPU torch defaults to the per-tensor loop, a dozen small kernels for each parameter
tensor; the fused kernel makes one pass over every parameter. Prints milliseconds per step
and the loop / fused ratio for the README model's size (bi-GRU 128) and the G2P size (two
layers of 256), with random gradients (the update's cost does not depend on their values).

    python benchmarks/bench_optimizer.py            # one thread, 50 steps each
    python benchmarks/bench_optimizer.py --threads 2
"""

from __future__ import annotations

import argparse
import time

import machine
import torch

from skattn.models import ModelConfig, Seq2SeqModule
from skattn.training import adam

SIZES = (  # label, ModelConfig overrides
    ("bi-GRU 128 (the README model)", dict(hidden_size=128, num_layers=1)),
    ("bi-GRU 256 x 2 (G2P)", dict(hidden_size=256, num_layers=2)),
)
VARIANTS = (  # label, optimizer factory
    ("loop", lambda params: torch.optim.Adam(params, lr=1e-3, foreach=False, fused=False)),
    ("foreach", lambda params: torch.optim.Adam(params, lr=1e-3, foreach=True)),
    ("fused (training.adam)", lambda params: adam(params, 1e-3)),
)


def ms_per_step(optimizer: torch.optim.Optimizer, steps: int) -> float:
    for _ in range(3):  # warm-up: the state tensors are created on the first step
        optimizer.step()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    machine.use_threads(args.threads)
    print(f"# {machine.describe()}; torch {torch.__version__}, {args.threads} thread(s)")
    print(
        "| model | parameters (tensors) | "
        + " | ".join(v for v, _ in VARIANTS)
        + " | loop / fused |"
    )
    print("|---|---:|" + "---:|" * (len(VARIANTS) + 1))
    for label, sizes in SIZES:
        torch.manual_seed(0)
        module = Seq2SeqModule(ModelConfig(40, 40, embedding_dim=64, **sizes))
        params = list(module.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        times = {name: ms_per_step(make(params), args.steps) for name, make in VARIANTS}
        count = sum(p.numel() for p in params)
        cells = " | ".join(f"{t:.2f} ms" for t in times.values())
        ratio = times["loop"] / times["fused (training.adam)"]
        print(f"| {label} | {count:,} ({len(params)}) | {cells} | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
