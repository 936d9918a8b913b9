"""What this process may use: the cores and the GPU its engine allotted it.

torch sizes its intra-op thread pool by the machine's core count and ignores the CPU affinity
mask, the cgroup quota and the cluster engine's reservation, so a fit confined to one core, or
one of several fits on a Dask or Ray worker, would run more threads than it has cores. The
estimator asks this module instead::

    Ray task or actor      -> the CPUs Ray reserved for it (``num_cpus``); its GPU (``num_gpus``)
    OMP_NUM_THREADS set    -> that many (joblib's loky cap ``cpu_count // n_jobs``, Dask's nanny
                              and Ray set it in their workers; a user may too)
    Dask worker            -> its usable cores over its ``nthreads`` task slots; GPU: the
                              ``"GPU"`` resource it was started with
    otherwise              -> the usable cores (affinity mask capped by the cgroup quota)

always capped by the usable cores. A worker of an engine takes a GPU only when the engine
reserved one for it; outside an engine ``device="auto"`` takes the first CUDA device.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from skattn.core.checks import usable_cores

__all__ = ["Allotment", "auto_device", "current", "default_threads", "torch_threads"]


@dataclass(frozen=True)
class Allotment:
    """What a cluster engine reserved for the running task (``engine=None``: no engine).

    ``cpus`` is the task's reserved cores (Ray), ``nthreads`` the worker's task slots (Dask),
    ``gpus`` the GPUs reserved (Ray's ``num_gpus``, Dask's ``"GPU"`` resource), and ``slot``
    the worker's index among its host's workers when the engine names one (Dask's LocalCluster
    names workers 0, 1, ...; ``dask worker --name 1`` names one), used to give each Dask worker
    its own GPU.
    """

    engine: str | None = None
    cpus: float | None = None
    nthreads: int | None = None
    gpus: float = 0.0
    slot: int = 0


def current() -> Allotment:
    """The allotment of this process: read from Ray or Dask only when they are imported."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
            resources = ray.get_runtime_context().get_assigned_resources()
            return Allotment("ray", resources.get("CPU"), gpus=resources.get("GPU", 0.0))
    if "distributed" in sys.modules:
        from distributed import get_worker

        try:
            worker = get_worker()
        except ValueError:  # not inside a task of a Dask worker
            return Allotment()
        gpus = worker.state.total_resources.get("GPU", 0.0)
        return Allotment("dask", nthreads=worker.state.nthreads, gpus=gpus, slot=_slot(worker.name))
    return Allotment()


def _slot(name: object) -> int:
    """A Dask worker's index from its name: LocalCluster's ints, ``dask worker --name 1``'s
    strings of digits; 0 for any other name (a worker named by its address)."""
    if isinstance(name, int) and not isinstance(name, bool):
        return name
    if isinstance(name, str) and name.isascii() and name.isdigit():
        return int(name)
    return 0


def default_threads(
    allotment: Allotment, environ: Mapping[str, str] = os.environ, cores: int | None = None
) -> int:
    """torch threads for a task with ``allotment`` in a process that may use ``cores``.

    See the module's docstring for the order; at least 1, at most ``cores``.
    """
    cores = usable_cores() if cores is None else cores
    # OpenMP's list form "2,1" sets each nesting level: torch's threads are the outer one
    omp = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if allotment.engine == "ray" and allotment.cpus and math.isfinite(allotment.cpus):
        threads = math.floor(allotment.cpus)
    elif omp.isascii() and omp.isdigit():  # not "²", which isdigit() and int() refuses
        threads = int(omp)
    elif allotment.engine == "dask" and allotment.nthreads:
        threads = cores // allotment.nthreads
    else:
        threads = cores
    return max(1, min(threads, cores))


def auto_device(
    allotment: Allotment, device_count: int, environ: Mapping[str, str] = os.environ
) -> str:
    """The torch device ``device="auto"`` means, given ``device_count`` visible CUDA devices.

    Ray makes only a task's reserved GPUs visible, so its GPU is ``cuda:0``. A Dask worker sees
    every GPU of its host: worker ``slot`` takes GPU ``slot mod device_count``, unless its
    ``CUDA_VISIBLE_DEVICES`` already puts its own GPU first, as dask-cuda's workers' do (the
    host's GPUs rotated to start at the worker's index: ``"1,0"`` for worker 1 of 2), when it
    takes ``cuda:0``. A worker without a reserved GPU uses the CPU.
    """
    if device_count < 1:
        return "cpu"
    if allotment.engine is None:
        return "cuda"
    if allotment.gpus <= 0:
        return "cpu"
    if allotment.engine != "dask" or _own_gpu_first(allotment.slot, environ):
        return "cuda:0"
    return f"cuda:{allotment.slot % device_count}"


def _own_gpu_first(slot: int, environ: Mapping[str, str]) -> bool:
    """Whether ``CUDA_VISIBLE_DEVICES`` lists the cluster's GPUs (the host's, or a subset such
    as ``"2,3"``) rotated to start at worker ``slot``'s, as dask-cuda sets it per worker
    (``visible[slot:] + visible[:slot]``); not for one list shared by every worker, in order,
    as a user sets it (``"0,1"``). GPU UUIDs have no order to read: a rotated list of them is
    taken as shared (start one worker per GPU with a list of one there)."""
    parts = [part.strip() for part in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if not all(part.isascii() and part.isdigit() for part in parts):
        return False
    ids = [int(part) for part in parts]
    base, k = sorted(ids), slot % len(ids)
    return len(ids) > 1 and ids != base and ids == base[k:] + base[:k]


@contextmanager
def torch_threads(n_threads: int | None) -> Iterator[int]:
    """Run the block with ``n_threads`` torch threads (``None``: :func:`default_threads` of
    :func:`current`), restore the previous count after; yields the count used."""
    threads = default_threads(current()) if n_threads is None else n_threads
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(previous)
