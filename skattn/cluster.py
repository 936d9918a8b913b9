"""Settings for Dask workers that run skattn's fits.

Two of a Dask worker's defaults cost a fit of this library CPU it cannot spare on a small
machine (measured by ``benchmarks/bench_cluster.py``; see the README):

- the worker's statistical profiler samples every thread's stack every 10 ms, taking the GIL
  from the training loop each time: about 0.1 s of a 2 s fit's thread CPU;
- each worker imports torch and scikit-learn on its first task, about 5 s of CPU, inside the
  first fit it runs. Preloading the estimator at the worker's start moves that to start-up.

Apply them to a local cluster while it is created::

    import dask
    from distributed import LocalCluster
    from skattn.cluster import DASK_WORKER_CONFIG

    with dask.config.set(DASK_WORKER_CONFIG):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1)

(workers a cluster adds later, by ``cluster.scale``, read the config of that moment), and to
workers started from a shell with ``dask worker SCHEDULER --preload skattn.estimator``
and ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False`` in their environment.
"""

from __future__ import annotations

__all__ = ["DASK_WORKER_CONFIG"]

DASK_WORKER_CONFIG: dict[str, object] = {
    "distributed.worker.profile.enabled": False,
    "distributed.worker.preload": ["skattn.estimator"],
}
