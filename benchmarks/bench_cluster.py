"""Beyond one process, side by side in one run: grid search and serving replicas on this machine.

1. Search: the 12-candidate grid of ``examples/grid_search.py`` (scorer x decoder x input
   feeding) with 3-fold CV, timed with ``n_jobs=1`` in this process, on joblib's own pool of 2
   plain processes (loky: what 2 workers can do without an engine), on a Dask LocalCluster of
   2 one-thread worker processes (Dask's defaults, and ``skattn.cluster.DASK_WORKER_CONFIG``),
   and on a local Ray head of 2 CPUs (joblib backends). The ``cv_results_`` scores and ranks of
   each must equal the ``n_jobs=1`` run's. ``--rounds`` searches per engine, every second round
   in reverse order, since this machine's speed drifts by up to 1.4x over minutes; start-up
   (creating the cluster) is timed apart from the search.
2. Serving: a small reversal model (bi-GRU 64, greedy) behind the plain server
   (``python -m serving``), then Ray Serve with 2 replicas behind Ray's default Python proxy,
   with 2 behind its HAProxy ingress, with 1 and 2 under
   ``serving.ray_deployment.THROUGHPUT_ENV``, and with 1 and 2 that listen on a shared port
   themselves (``shared_port``: no ingress hop); ``--clients`` concurrent one-item clients for
   ``--duration`` seconds each (the Python client: every answer checked against
   ``serving.load(...).predict``), then, with ``--lean``, the same Python client speaking HTTP
   itself instead of through httpx (answers checked, at a fraction of the CPU), and with
   ``--wrk`` the same from Debian's ``wrk`` (a C client that leaves the servers more of the 2
   cores; status codes checked, not answers).
   Each window also reads how busy the machine was (``/proc/stat``: cores in use, and CPU per
   request of everything on it, client included) and how many of those cores the client
   itself took: where it takes one whole core, the Python client measures itself.
   ``--model-dir DIR --sources FILE`` serves another artifact (the packaged G2P models: a
   model whose search is the main cost) on the first fields of FILE's lines; ``--servers``
   picks the set-ups, among them the plain server with ``--instances 2`` or
   ``--intra-op-threads 2``.

    python benchmarks/bench_cluster.py                  # 2 rounds of 12 x 3 fits, 64 clients x 30 s
    python benchmarks/bench_cluster.py --quick          # 3 x 2 fits, 16 clients x 5 s
    python benchmarks/bench_cluster.py --only search    # or: --only serving [--wrk] [--lean]
    python benchmarks/bench_cluster.py --only serving --wrk \
        --model-dir serving/models/cmudict-g2p-int8 --sources cmudict-0.7b.test \
        --servers plain plain-2-instances ray-fast-1 ray-fast-2

The honest ceiling: this machine has 2 cores (``usable_cores()``). Two workers can at best halve
the search's wall time, and the load generator, Ray's proxy and controller and the replicas all
share those 2 cores, so Ray Serve's figures here are what it costs on one small box, not what 2
replicas do on 2 machines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import joblib
import numpy as np
from sklearn.model_selection import GridSearchCV, KFold

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from bench_server import expected_predictions  # noqa: E402
from grid_search import PARAM_GRID, QUICK_GRID, make_task  # noqa: E402
from load_clients import drive_python, drive_wrk, wrk_available  # noqa: E402
from machine import describe  # noqa: E402

from skattn import Seq2Seq  # noqa: E402
from skattn.cluster import DASK_WORKER_CONFIG, local_dask_cluster, warm_up  # noqa: E402
from skattn.scoring import SCORERS  # noqa: E402

#: The serving half's servers: option name -> the table's name. ``plain`` is every ratio's base.
SERVERS = {
    "plain": "plain server",
    "plain-2-threads": "plain server, --intra-op-threads 2",
    "plain-2-instances": "plain server, --instances 2",
    "ray-python": "ray serve, python proxy, 2 replicas",
    "ray-haproxy": "ray serve, haproxy, 2 replicas",
    "ray-fast-1": "ray serve, THROUGHPUT_ENV, 1 replica",
    "ray-fast-2": "ray serve, THROUGHPUT_ENV, 2 replicas",
    "ray-shared-1": "ray serve, shared port, 1 replica",
    "ray-shared-2": "ray serve, shared port, 2 replicas",
}
DEFAULT_SERVERS = [
    "plain", "ray-python", "ray-haproxy", "ray-fast-1", "ray-fast-2", "ray-shared-1",
    "ray-shared-2",
]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small grid, short load levels")
    parser.add_argument("--only", choices=("search", "serving"), help="one half of the run")
    parser.add_argument("--steps", type=int, default=60, help="training steps per fit")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="searches per engine; every second round runs them in reverse order (Ray last)",
    )
    parser.add_argument("--clients", type=int, default=64, help="concurrent serving clients")
    parser.add_argument(
        "--duration", type=float, default=30.0, help="seconds per server and client"
    )
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--wrk", action="store_true", help="serving: also drive each with wrk")
    parser.add_argument(
        "--lean",
        action="store_true",
        help="serving: also drive each with the lean Python client (HTTP over asyncio's "
        "streams, every answer checked, far less CPU a request than httpx)",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        help="serving: this artifact instead of the small reversal model (for example "
        "serving/models/cmudict-g2p-int8); --sources then names its inputs",
    )
    parser.add_argument(
        "--sources",
        type=Path,
        help="serving: a text file whose lines' first fields are the sources to send (a "
        "CMUdict file works); 512 of them, spread over the file",
    )
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=SERVERS,
        default=DEFAULT_SERVERS,
        help="serving: which servers to run (default: the plain one and the six Ray Serve "
        "set-ups); the plain server always runs, first",
    )
    args = parser.parse_args(argv)
    if (args.model_dir is None) != (args.sources is None):
        parser.error("--model-dir and --sources go together")
    if args.quick:
        args.steps, args.hidden_size, args.clients, args.duration = 5, 16, 16, 5.0
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.wrk and not wrk_available():
        parser.error("--wrk: no wrk on PATH (Debian: apt install wrk)")
    args.cv = 2 if args.quick else 3
    return args


# ---------------------------------------------------------------- 1. search


def new_search(args: argparse.Namespace) -> GridSearchCV:
    model = Seq2Seq(
        hidden_size=args.hidden_size,
        embedding_dim=args.hidden_size // 2,
        batch_size=32,
        max_steps=args.steps,
        early_stopping=False,
        random_state=0,
    )
    return GridSearchCV(
        model,
        QUICK_GRID if args.quick else PARAM_GRID,
        scoring=SCORERS["token_accuracy"],
        cv=KFold(args.cv, shuffle=True, random_state=0),
        n_jobs=-1,
        pre_dispatch="all",  # as examples/grid_search_cluster.py: the engine queues every fit
        refit=False,
    )


@contextlib.contextmanager
def dask_workers(config: dict | None = None) -> Iterator[None]:
    """A local cluster of 2 one-thread workers created under the Dask ``config`` (None: Dask's
    defaults), with joblib's Dask backend on it."""
    from distributed import Client

    with local_dask_cluster(2, config or {}) as cluster, Client(cluster):
        with joblib.parallel_backend("dask"):
            yield


@contextlib.contextmanager
def ray_workers() -> Iterator[None]:
    import ray
    from ray.util.joblib import register_ray

    omp = os.environ.get("OMP_NUM_THREADS")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    register_ray()
    try:
        with joblib.parallel_backend("ray"):
            yield
    finally:
        ray.shutdown()
        # ray.init set OMP_NUM_THREADS=1 in this process: the next round's n_jobs=1 needs its own
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp


@contextlib.contextmanager
def loky_workers() -> Iterator[None]:
    """joblib's own process pool: 2 plain processes, no engine (the ceiling of 2 workers)."""
    from joblib.externals.loky import get_reusable_executor

    try:
        with joblib.parallel_backend("loky", n_jobs=2):
            yield
    finally:
        get_reusable_executor().shutdown(wait=True)  # the next round starts its workers afresh


# name, engine, search's n_jobs, estimator's n_threads. n_jobs=1 takes the process's default
# threads (2 here); the n_threads=1 row tells the gain of one-thread fits from that of 2 processes
ENGINES = [
    ("n_jobs=1", contextlib.nullcontext, 1, None),
    ("n_jobs=1, n_threads=1", contextlib.nullcontext, 1, 1),
    ("loky, 2 processes", loky_workers, -1, None),
    ("dask, 2 workers", dask_workers, -1, None),
    ("dask, 2 workers, DASK_WORKER_CONFIG", partial(dask_workers, DASK_WORKER_CONFIG), -1, None),
    ("ray, 2 CPUs", ray_workers, -1, None),
]


def round_order(round_index: int) -> list[tuple]:
    """The engines in the order round ``round_index`` (0-based) times them: every second round
    reversed, so that a machine drifting over minutes favours no side. Ray runs last in every
    round, since ``ray.init`` changes this process's thread environment."""
    *others, ray = ENGINES
    return [*(others[::-1] if round_index % 2 else others), ray]


def bench_search(args: argparse.Namespace) -> list[str]:
    """Each engine's start-up (the cluster created, workers preloading what its config names)
    and search, timed apart: Dask's defaults, loky and Ray import torch inside their first
    fits, DASK_WORKER_CONFIG during start-up, so only start-up plus search compares all. This
    process is warmed up first, so that n_jobs=1 does not carry those imports either."""
    warm_up()
    X, y = make_task("reversal", 32 * args.steps * args.cv // (args.cv - 1), 0)
    startup: dict[str, list[float]] = {name: [] for name, *_ in ENGINES}
    search_s: dict[str, list[float]] = {name: [] for name, *_ in ENGINES}
    results: dict[str, list[dict]] = {name: [] for name, *_ in ENGINES}
    for round_index in range(args.rounds):
        for name, engine, n_jobs, n_threads in round_order(round_index):
            search = new_search(args).set_params(n_jobs=n_jobs, estimator__n_threads=n_threads)
            start = time.perf_counter()
            with engine():
                ready = time.perf_counter()
                search.fit(X, y)
                done = time.perf_counter()
            startup[name].append(ready - start)
            search_s[name].append(done - ready)
            results[name].append(search.cv_results_)
            print(
                f"round {round_index + 1}, search on {name}: {done - ready:.1f} s "
                f"(start-up {ready - start:.1f} s)",
                flush=True,
            )
    serial = results["n_jobs=1"][0]
    n_fits = len(serial["params"]) * args.cv
    lines = [
        f"grid search: {len(serial['params'])} candidates x {args.cv} folds = {n_fits} fits of "
        f"{args.steps} steps (hidden {args.hidden_size}), {len(X)} pairs, {args.rounds} rounds "
        "(every second one in reverse order); medians over the rounds",
        "| engine | search per round (s) | start-up (s) | search (s) | search vs n_jobs=1 | "
        "start-up + search vs n_jobs=1 | same scores and ranks |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    searching = {name: float(np.median(values)) for name, values in search_s.items()}
    total = {name: float(np.median(np.add(startup[name], search_s[name]))) for name in search_s}
    for name in search_s:
        same = all(
            np.array_equal(run[key], serial[key])
            for run in results[name]
            for key in ("rank_test_score", "mean_test_score", "split0_test_score")
        )
        rounds = ", ".join(f"{s:.1f}" for s in search_s[name])
        lines.append(
            f"| {name} | {rounds} | {np.median(startup[name]):.1f} | {searching[name]:.1f} "
            f"| {searching['n_jobs=1'] / searching[name]:.2f}x "
            f"| {total['n_jobs=1'] / total[name]:.2f}x | {same} |"
        )
    return lines


# ---------------------------------------------------------------- 2. serving

MODEL = "reverse"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def reversal_artifact(directory: Path) -> Path:
    """A small character-reversal model (bi-GRU 64, greedy), fitted and exported."""
    rng = random.Random(0)
    X = ["".join(rng.choices("abcdefghij", k=rng.randint(1, 10))) for _ in range(800)]
    model = Seq2Seq(embedding_dim=32, hidden_size=64, max_epochs=10, n_threads=1, random_state=0)
    return model.fit(X, [x[::-1] for x in X]).export_onnx(directory / MODEL)


@contextlib.contextmanager
def plain_server(model_dir: Path, *options: str) -> Iterator[str]:
    """``python -m serving`` in a subprocess, serving ``model_dir`` as ``MODEL``, once ready."""
    port = free_port()
    command = [sys.executable, "-m", "serving", "--model-dir", f"{MODEL}={model_dir}"]
    command += ["--port", str(port), *options]
    process = subprocess.Popen([*command, "--log-level", "warning"], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def ray_serve(
    model_dir: Path,
    replicas: int | None,
    env: dict[str, str],
    shared_port: bool = False,
    app_args: dict | None = None,
    num_cpus: int = 2,
) -> Iterator[str]:
    """Ray Serve with ``replicas`` replicas, Ray started with ``num_cpus`` under the environment
    ``env`` (its ingress and request path are read when Ray starts: ``{}`` is the Python proxy;
    the keys of ``THROUGHPUT_ENV`` that ``env`` leaves out are unset, whatever the shell
    exports), the replicas logging at warning as the plain server here; ``app_args``: more of
    ``build``'s arguments (with ``replicas`` None, autoscaling's). With ``shared_port`` the
    replicas listen on a port of their own (``SO_REUSEPORT``), whose URL this yields: no
    ingress hop."""
    import ray
    from ray import serve

    from serving.ray_deployment import THROUGHPUT_ENV, build

    keys = set(THROUGHPUT_ENV) | set(env)
    saved = {key: os.environ.get(key) for key in keys}
    try:
        for key in keys:
            os.environ.pop(key, None)
        os.environ.update(env)
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {"model_dir": str(model_dir), "model_name": MODEL, "log_level": "warning"}
        if replicas is not None:
            args["num_replicas"] = replicas
        if shared_port:
            port = args["shared_port"] = free_port()
        serve.run(build({**args, **(app_args or {})}), name="bench", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def busy_jiffies() -> tuple[int, int]:
    """(busy, all) CPU jiffies of the whole machine so far (``/proc/stat``'s first line: user,
    nice, system, idle, iowait, irq, softirq, steal; guest time is inside user and nice
    already). Steal counts as busy: a core the hypervisor gave away did not serve. (0, 0)
    where there is no ``/proc/stat``."""
    try:
        line = Path("/proc/stat").read_text().split("\n", 1)[0]
    except OSError:
        return 0, 0
    fields = [int(x) for x in line.split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def client_cpu_seconds(client: str) -> float:
    """CPU seconds so far of the load generator: this process (the Python client runs in it),
    or its waited-for children (each wrk run)."""
    if client.startswith("python"):
        return time.process_time()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Level:
    server: str
    client: str
    requests: int
    errors: int
    wrong: int | None  # None: not checked (wrk)
    throughput: float
    p50_ms: float
    p99_ms: float
    cores_busy: float  # the whole machine's, client included
    cpu_ms_per_request: float
    client_cores: float  # the load generator's own share of cores_busy


def drive(url: str, expected: dict[str, str], args: argparse.Namespace, name: str,
          client: str) -> Level:  # fmt: skip
    """``args.clients`` clients, each on its own connection, sending one-item requests back to
    back for ``args.duration`` seconds after ``args.warmup``; the Python client checks every
    answer. The machine's busy cores, and the client's own (this process's CPU time for the
    Python client, wrk's as a child process), are read over the warm-up and the window together
    (the clients run the warm-up inside their call; both are the same steady load)."""
    infer = f"/v2/models/{MODEL}/infer"
    sources = sorted(expected)
    start_busy, start_all = busy_jiffies()
    start_client, start_wall = client_cpu_seconds(client), time.monotonic()
    if client.startswith("python"):
        window = asyncio.run(drive_python(
            f"{url}{infer}", sources, expected, args.clients, args.duration, args.warmup,
            lean=client == "python-lean",
        ))  # fmt: skip
    else:
        # 64 of the sources spread over the sorted list (wrk's script holds its bodies)
        spread = sources[:: max(1, len(sources) // 64)][:64]
        window = drive_wrk(url, infer, spread, args.clients, args.duration, args.warmup, None)
    end_busy, end_all = busy_jiffies()
    client_cores = (client_cpu_seconds(client) - start_client) / (time.monotonic() - start_wall)
    if end_all > start_all:
        cores = (end_busy - start_busy) / (end_all - start_all) * (os.cpu_count() or 1)
    else:
        cores = float("nan")
    rate = window.requests / window.seconds
    return Level(
        name, client, window.requests, window.errors,
        window.mismatches if client.startswith("python") else None,
        round(rate, 1), round(window.p50_ms, 1), round(window.p99_ms, 1), cores,
        1000 * cores / max(rate, 1e-9), client_cores,
    )  # fmt: skip


def serving_sources(args: argparse.Namespace) -> list[str]:
    """512 sources: random letter strings for the reversal model, else ``--sources``' first
    fields, spread over the file."""
    if args.sources is None:
        rng = random.Random(1)
        return ["".join(rng.choices("abcdefghij", k=rng.randint(1, 12))) for _ in range(512)]
    lines = [line.split() for line in args.sources.read_text(encoding="utf-8").splitlines()]
    fields = sorted({line[0] for line in lines if line})
    if not fields:
        raise SystemExit(f"--sources {args.sources}: no sources in the file")
    return fields[:: max(1, len(fields) // 512)][:512]


def bench_serving(args: argparse.Namespace) -> list[str]:
    from serving.ray_deployment import THROUGHPUT_ENV

    clients = ["python"] + (["python-lean"] if args.lean else []) + (["wrk"] if args.wrk else [])
    haproxy, fast = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}, THROUGHPUT_ENV
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model_dir or reversal_artifact(Path(scratch))
        sources = serving_sources(args)
        expected = expected_predictions(model_dir, sources, "cpu")  # the answers' wire form
        servers = {
            "plain": lambda: plain_server(model_dir),
            "plain-2-threads": lambda: plain_server(model_dir, "--intra-op-threads", "2"),
            "plain-2-instances": lambda: plain_server(model_dir, "--instances", "2"),
            "ray-python": lambda: ray_serve(model_dir, 2, {}),
            "ray-haproxy": lambda: ray_serve(model_dir, 2, haproxy),
            "ray-fast-1": lambda: ray_serve(model_dir, 1, fast),
            "ray-fast-2": lambda: ray_serve(model_dir, 2, fast),
            "ray-shared-1": lambda: ray_serve(model_dir, 1, fast, shared_port=True),
            "ray-shared-2": lambda: ray_serve(model_dir, 2, fast, shared_port=True),
        }
        for key in ["plain", *(key for key in args.servers if key != "plain")]:
            name = SERVERS[key]
            with servers[key]() as url:
                for client in clients:
                    results.append(drive(url, expected, args, name, client))
                    print(f"{name}, {client}: {results[-1].throughput} req/s", flush=True)
    model = args.model_dir or "reversal model (bi-GRU 64, greedy)"
    lines = [
        f"serving: {args.clients} concurrent one-item clients x {args.duration:g} s, "
        f"{model}; cores busy and CPU per request: the whole machine "
        "(client included) over the window; client cores: the load generator's own share",
        "| server | client | req/s | vs plain | p50 ms | p99 ms | errors | wrong answers "
        "| cores busy | client cores | machine CPU ms / request |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_row = {(r.server, r.client): r.throughput for r in results}
    for r in results:
        wrong = "not read" if r.wrong is None else r.wrong
        vs_plain = r.throughput / by_row["plain server", r.client]
        lines.append(
            f"| {r.server} | {r.client} | {r.throughput} | {vs_plain:.2f}x "
            f"| {r.p50_ms} | {r.p99_ms} | {r.errors} | {wrong} | {r.cores_busy:.2f} "
            f"| {r.client_cores:.2f} | {r.cpu_ms_per_request:.3f} |"
        )
    for ingress, (one_key, two_key) in {
        "THROUGHPUT_ENV": ("ray-fast-1", "ray-fast-2"),
        "shared port": ("ray-shared-1", "ray-shared-2"),
    }.items():
        for client in clients:
            two = by_row.get((SERVERS[two_key], client))
            one = by_row.get((SERVERS[one_key], client))
            if one is not None and two is not None:
                lines.append(
                    f"ray serve ({ingress}), {client}: 2 replicas / 1 replica {two / one:.2f}x"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    report = [f"{describe()} (the cores are the ceiling of every figure below)"]
    if args.only != "serving":
        report += bench_search(args)
        print("\n".join(report), flush=True)  # kept if the serving half fails
    if args.only != "search":
        report += bench_serving(args)
    print("\n" + "\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
