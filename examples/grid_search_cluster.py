"""The grid search of ``examples/grid_search.py`` on a cluster: Dask or Ray, through joblib.

scikit-learn's searches run their fits through joblib, so a cluster is a joblib backend: Dask's
(``distributed``) or Ray's (``ray.util.joblib``). Each fit trains with the threads its worker
was allotted (``Seq2Seq(n_threads=None)``: a Ray task's ``num_cpus``, a Dask worker's share),
and the fitted models come back to this process, where they predict, export and serve.

    python examples/grid_search_cluster.py                          # a local Dask cluster
    python examples/grid_search_cluster.py --scheduler tcp://HOST:8786
    python examples/grid_search_cluster.py --ray auto               # a running Ray cluster
    python examples/grid_search_cluster.py --ray local              # a local Ray head
    python examples/grid_search_cluster.py --quick                  # a smoke run

A local Dask cluster starts with ``skattn.cluster.DASK_WORKER_CONFIG`` (the workers' profiler
off, torch and the estimator imported at start, the scheduler holding the queue); start a
standing cluster the same way (``DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION=1.0 dask
scheduler``, ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False dask worker ... --preload
skattn.cluster``). The search submits all its fits at once (``pre_dispatch="all"``), so a worker
that finishes one takes the next from the scheduler without waiting for this process.

GPU workers: start Dask workers with ``--resources GPU=1`` (one worker per GPU) and Ray with
``num_gpus`` per task; ``device="auto"`` then takes the worker's own GPU (``skattn.allotment``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import joblib
from sklearn.model_selection import GridSearchCV, KFold

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_search import PARAM_GRID, QUICK_GRID, make_task, results_table  # noqa: E402

from skattn import Seq2Seq  # noqa: E402
from skattn.cluster import local_dask_cluster  # noqa: E402
from skattn.core.checks import usable_cores  # noqa: E402
from skattn.scoring import SCORERS  # noqa: E402


@contextlib.contextmanager
def dask_backend(scheduler: str | None, n_workers: int) -> Iterator[str]:
    """joblib's Dask backend on ``scheduler``, or on a LocalCluster of ``n_workers`` processes
    of one thread each on 127.0.0.1 (:func:`skattn.cluster.local_dask_cluster`)."""
    from distributed import Client

    with contextlib.ExitStack() as stack:
        if scheduler is None:
            scheduler = stack.enter_context(local_dask_cluster(n_workers))
        client = stack.enter_context(Client(scheduler))
        stack.enter_context(joblib.parallel_backend("dask"))
        workers = client.scheduler_info()["workers"].values()
        yield f"dask, {sum(w['nthreads'] for w in workers)} threads"


@contextlib.contextmanager
def ray_backend(address: str, n_workers: int) -> Iterator[str]:
    """joblib's Ray backend on the Ray cluster at ``address`` (``"local"``: a head here)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.util.joblib import register_ray

    if address == "local":
        ray.init(num_cpus=n_workers, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    register_ray()
    try:
        with joblib.parallel_backend("ray"):
            yield f"ray, {int(ray.cluster_resources().get('CPU', 0))} CPUs"
    finally:
        ray.shutdown()


def reachable(address: str, timeout: float = 5.0) -> None:
    """``ValueError`` unless ``address`` (``tcp://HOST:PORT``, ``ray://HOST:PORT`` or
    ``HOST:PORT``) names a port that accepts a TCP connection within ``timeout`` seconds; other
    schemes are left to the engine."""
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "tcp", "ray"):  # (tls://, ucx://, ...: the engine checks its own)
        return
    host, _, port = rest.rpartition(":")
    if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("not an address of the form [tcp://]HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        raise ValueError(f"nothing answers there ({error})") from None


def main(argv: list[str] | None = None) -> GridSearchCV:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument("--scheduler", help="a Dask scheduler's address (tcp://HOST:8786)")
    engine.add_argument("--ray", metavar="ADDRESS", help="a Ray cluster's address, or 'local'")
    cores = usable_cores()
    parser.add_argument("--workers", type=int, default=cores, help="of a local cluster")
    parser.add_argument("--steps", type=int, help="training steps per fit (150; --quick: 5)")
    parser.add_argument("--cv", type=int, help="folds (3; --quick: 2)")
    parser.add_argument("--quick", action="store_true", help="a tiny grid: a smoke run")
    args = parser.parse_args(argv)
    # --quick's values only where none was given
    args.steps = args.steps if args.steps is not None else (5 if args.quick else 150)
    args.cv = args.cv if args.cv is not None else (2 if args.quick else 3)
    if args.steps < 1 or args.cv < 2 or args.workers < 1:
        parser.error("--steps and --workers must be >= 1 and --cv >= 2")
    if args.workers > cores and args.scheduler is None and args.ray in (None, "local"):
        parser.error(
            f"--workers: at most the {cores} cores this process may use, got "
            f"{args.workers} (each worker trains on a core of its own)"
        )
    for flag, address in (("--scheduler", args.scheduler), ("--ray", args.ray)):
        if address is not None and address not in ("local", "auto"):
            try:  # before anything starts: a Ray driver waits for ever on a dead address
                reachable(address)
            except ValueError as error:
                parser.error(f"{flag} {address}: {error}")

    batch_size = 32
    X, y = make_task("reversal", batch_size * args.steps * args.cv // (args.cv - 1), 0)
    size = 16 if args.quick else 64
    model = Seq2Seq(
        hidden_size=size,
        embedding_dim=size // 2,
        batch_size=batch_size,
        max_steps=args.steps,
        early_stopping=False,
        random_state=0,
    )
    search = GridSearchCV(
        model,
        QUICK_GRID if args.quick else PARAM_GRID,
        scoring=SCORERS["token_accuracy"],
        cv=KFold(args.cv, shuffle=True, random_state=0),
        n_jobs=-1,
        pre_dispatch="all",  # the scheduler queues them all: a free worker never waits on us
    )
    if args.ray is not None:
        backend = ray_backend(args.ray, args.workers)
    else:
        backend = dask_backend(args.scheduler, args.workers)
    with backend as where:
        start = time.perf_counter()
        search.fit(X, y)
        seconds = time.perf_counter() - start
    n_configs = len(search.cv_results_["params"])
    print(f"\n{n_configs} configurations x {args.cv} folds on {where} ({seconds:.1f} s):\n")
    print(results_table(search.cv_results_))
    best = search.best_estimator_  # refitted in this process after the search
    print(f"\nbest: {search.best_params_} ({search.best_score_:.3f}), trained with")
    print(f"{best.n_threads_} thread(s); it reverses '12345' as {best.predict(['12345'])[0]!r}")
    return search


if __name__ == "__main__":
    main()
