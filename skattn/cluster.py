"""Settings for Dask workers that run skattn's fits.

Two of a Dask worker's defaults cost a fit of this library CPU it cannot spare on a small
machine (measured by ``benchmarks/bench_cluster.py``; see the README):

- the worker's statistical profiler samples every thread's stack every 10 ms, taking the GIL
  from the training loop each time: about 0.1 s of a 2 s fit's thread CPU;
- each worker imports torch and scikit-learn on its first task, about 5 s of CPU, inside the
  first fit it runs. Preloading the estimator at the worker's start moves that to start-up.

:func:`local_dask_cluster` creates a local cluster under them (the config is read while the
cluster is created: workers it adds later, by ``cluster.scale``, read the config of that
moment)::

    from distributed import Client
    from skattn.cluster import local_dask_cluster

    with local_dask_cluster(2) as cluster, Client(cluster):
        ...

Apply them to workers started from a shell with ``dask worker SCHEDULER --preload skattn.estimator``
and ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False`` in their environment.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DASK_WORKER_CONFIG", "local_dask_cluster"]

DASK_WORKER_CONFIG: dict[str, object] = {
    "distributed.worker.profile.enabled": False,
    "distributed.worker.preload": ["skattn.estimator"],
}


def local_dask_cluster(n_workers: int, config: Mapping[str, object] = DASK_WORKER_CONFIG):
    """A ``distributed.LocalCluster`` of ``n_workers`` one-thread worker processes on
    127.0.0.1, without a dashboard, created under the Dask ``config`` (``{}``: Dask's
    defaults)."""
    import dask
    from distributed import LocalCluster

    with dask.config.set(dict(config)):
        return LocalCluster(
            n_workers=n_workers, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        )
