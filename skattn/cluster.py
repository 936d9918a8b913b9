"""Settings for Dask workers and schedulers that run skattn's fits.

Three of Dask's defaults cost a search of this library time it cannot spare on a small machine
(measured by ``benchmarks/bench_cluster.py``; see the README):

- the worker's statistical profiler samples every thread's stack every 10 ms, taking the GIL
  from the training loop each time: about 0.1 s of a 2 s fit's thread CPU;
- each worker imports torch and scikit-learn on its first task (about 5 s of CPU on the hosts
  of 2026-12-02, 0.7 s more start-up on those of 2026-12-04), and torch imports
  ``torch._dynamo`` when the first optimizer is built, 1.1 s more, inside the first fit it
  runs. Preloading this module (:func:`dask_setup`, :func:`warm_up`) moves both to start-up;
- the scheduler sends each one-thread worker up to 2 tasks (``worker-saturation`` 1.1, rounded
  up), so one worker can queue a fit while the other idles. At 1.0 the scheduler keeps the
  queue and hands the next fit to whichever worker is free.

:func:`local_dask_cluster` creates a local cluster under them (the config is read while the
cluster is created: workers it adds later, by ``cluster.scale``, read the config of that
moment)::

    from distributed import Client
    from skattn.cluster import local_dask_cluster

    with local_dask_cluster(2) as cluster, Client(cluster):
        ...

Apply them to a cluster started from a shell with
``DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION=1.0 dask scheduler`` and
``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False dask worker SCHEDULER --preload skattn.cluster``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from skattn.core.checks import MAX_THREADS, check_int

__all__ = ["DASK_WORKER_CONFIG", "dask_setup", "local_dask_cluster", "warm_up"]

#: Dask settings for a cluster whose workers fit skattn models. Read where the workers and the
#: scheduler are created: :func:`local_dask_cluster` creates both under it; for a standing
#: cluster, set the scheduler's key in the scheduler's environment (see above), since a client
#: connecting to a running scheduler does not change it.
DASK_WORKER_CONFIG: dict[str, object] = {
    "distributed.worker.profile.enabled": False,
    "distributed.worker.preload": ["skattn.cluster"],
    "distributed.scheduler.worker-saturation": 1.0,
}


def warm_up() -> None:
    """Import what a process's first fit would: the estimator (torch, scikit-learn) and what
    torch imports on its first optimizer (``torch._dynamo``, 1.1 s here)."""
    import torch

    import skattn.estimator  # noqa: F401

    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])


def dask_setup(worker) -> None:
    """Dask's preload hook (``--preload skattn.cluster``): warm the worker up as it starts.
    Importing this module costs nothing; where torch or scikit-learn is missing, the worker
    logs the preload's error and starts cold, and its first fit raises the ImportError."""
    warm_up()


def local_dask_cluster(n_workers: int, config: Mapping[str, object] = DASK_WORKER_CONFIG):
    """A ``distributed.LocalCluster`` of ``n_workers`` one-thread worker processes on
    127.0.0.1, without a dashboard, created under the Dask ``config`` (``{}``: Dask's
    defaults).

    Its workers get ``OMP_NUM_THREADS=1`` (and MKL's, OpenBLAS') in their own environment
    only, at creation and at every restart; this process keeps its own. Workers added later
    by ``cluster.scale`` read the Dask config of that moment, whose default sets those
    variables in this process too."""
    check_int(n_workers, "n_workers", 1, MAX_THREADS)  # 0 or -1: a cluster that runs nothing
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a mapping of Dask settings, got {type(config).__name__}")
    import dask
    from distributed import LocalCluster

    # The nanny sets its "pre-spawn" variables in this process before it spawns a worker, and
    # leaves them there, at creation and at every restart or scale-up: OMP_NUM_THREADS=1 would
    # then make every later fit here (GridSearchCV's refit of the best model) train on one
    # thread. The thread counts go to the workers alone instead ("environ", set in the worker
    # before it starts), and what creation still leaves here is put back.
    before = dict(os.environ)
    try:
        with dask.config.set(dict(config)):
            pre_spawn = dict(dask.config.get("distributed.nanny.pre-spawn-environ") or {})
            moved = {name: pre_spawn.pop(name) for name in _THREAD_VARIABLES if name in pre_spawn}
            environ = {**(dask.config.get("distributed.nanny.environ") or {}), **moved}
            settings = {
                "distributed.nanny.pre-spawn-environ": pre_spawn,
                "distributed.nanny.environ": environ,
            }
            with dask.config.set(settings):
                return LocalCluster(
                    n_workers=n_workers,
                    threads_per_worker=1,
                    host="127.0.0.1",
                    dashboard_address=None,
                )
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        os.environ.update(before)


#: The variables Dask's nanny sets "before spawning" that size thread pools.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
