"""How a runtime lays its work on the cores: chunk sizes and workers.

``serving.load(...).predict`` sorts a long input by length, cuts it into chunks of at most
``max_batch_size`` items and decodes ``workers`` chunks at once, each in its own thread
(``skattn.core.inference.Translator``). The defaults come from here: chunks sized by the model's
width (:func:`default_chunk_items`) and, on the CPU, one worker per usable core with one
onnxruntime thread each (:func:`share_cores`); a server's batches get the cores but one,
shared among its instances (:func:`default_intra_op_threads`). Imports ``skattn.core`` only.
"""

from __future__ import annotations

import math

from skattn.core.checks import MAX_THREADS, check_int, usable_cores

__all__ = [
    "CHUNK_FLOATS",
    "carry_width",
    "default_chunk_items",
    "default_intra_op_threads",
    "share_cores",
]

#: Floats of memory and keys per source position that a chunk holds by default (128 KB): the
#: chunk's items are this over the model's memory + keys width, a power of 2 in 16 .. 256.
#: onnxruntime's per-call overhead is small, and larger chunks stop paying once a step's carry
#: leaves the caches, which happens at fewer items the wider a model's carry. The bi-GRU 256 G2P
#: model (512 floats: 64 items) decoded 1.10-1.32x (greedy) the words/s in chunks of 64 as of
#: 256 on one thread and 1.02-1.38x (beam 5) with two workers, a hidden-256 Luong model ran at
#: 43.6 GFLOP/s in a batch of 64 against 32.8 in one of 256, while the hidden-64 reversal model
#: (128 floats: 256 items) was 1.2-1.4x faster in chunks of 256 than of 64 with two workers
#: (``benchmarks/bench_runtime_chunks.py``: ``benchmarks/results/runtime_chunks_run3.txt`` and
#: ``runtime_chunks.txt``; ``infer_luong256.txt``). The estimator's torch path chunks 256 items,
#: where per-operator overhead favours large chunks.
CHUNK_FLOATS = 32768


def default_chunk_items(width: int | None) -> int:
    """Items per chunk for a model whose memory and keys are ``width`` floats per source
    position (None, unknown: 64). A large vocabulary searched with many beams gets fewer a
    chunk, whatever this says (``skattn.core.inference.STEP_LOGITS``)."""
    if not width:
        return 64
    return int(min(256, max(16, 2 ** round(math.log2(CHUNK_FLOATS / width)))))


def carry_width(encoder) -> int | None:
    """Floats per source position of the encoder's ``memory`` and ``keys`` (their last axes),
    or None when a graph leaves one symbolic."""
    sizes = [o.shape[-1] for o in encoder.get_outputs() if o.name in ("memory", "keys")]
    if len(sizes) != 2 or not all(isinstance(n, int) for n in sizes):
        return None
    return sum(sizes)


def default_intra_op_threads(instances: int = 1) -> int:
    """One core fewer than this process may use, shared among a server's ``instances``
    batches at once, at least 1 each: the event loop needs a core.

    On a small machine the difference matters: with every core given to onnxruntime, its
    threads and the HTTP event loop preempt each other on every operator of a large batch.
    """
    return max(1, (usable_cores() - 1) // instances)


def share_cores(
    workers: int | None, intra_op_num_threads: int | None, device_type: str, io_binding: bool
) -> tuple[int, int | None]:
    """``(workers, intra_op_num_threads)`` from what the caller gave (see
    :class:`serving.runtime.Runtime`): neither given, on the CPU: one worker per usable core with
    one onnxruntime thread each; ``workers`` alone: one thread each. IO binding decodes one chunk
    at a time."""
    if workers is None:
        if intra_op_num_threads is None and device_type == "cpu" and not io_binding:
            return usable_cores(), 1
        return 1, intra_op_num_threads
    check_int(workers, "workers", 1, MAX_THREADS)
    if workers > 1 and io_binding:
        raise ValueError(
            f"workers={workers}: IO binding (CUDA's default) decodes one chunk at a time; "
            "pass workers=1, or io_binding=False"
        )
    return workers, 1 if intra_op_num_threads is None else intra_op_num_threads
