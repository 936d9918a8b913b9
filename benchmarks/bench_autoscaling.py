"""Ray Serve's autoscaling on a shared port: replicas follow the shared port's load, and what a
scale-down costs its clients, with Linux's ``tcp_migrate_req`` off and on in one run.

The small reversal model of ``bench_cluster.py`` on Ray Serve (``serving.ray_deployment.build``
with ``shared_port`` and ``max_replicas``: the policy of ``serving.ray_autoscaling``), Ray's
timing made short (metrics every 0.5 s over 2 s, up after 1 s, down after 3 s). The clients
speak only to the shared port, so Ray's own count of requests sees none of them. Phases of
``--phases CLIENTS:SECONDS,...`` (default ``64:12,12:12`` three times): many clients (the replicas
should scale up to ``--max-replicas``), then few (down to 1). Every client posts one item
at a time and checks every answer; with ``--connections fresh`` (the default) it opens a new
connection for each request, as clients without a pool do, so connections keep arriving while a
replica closes its socket; ``keepalive`` keeps one each (reconnecting when an answer says
``Connection: close``).

Each scenario prints, per phase, the requests, errors (by kind) and wrong answers, the
running replicas Ray reported (every 0.5 s) and, while two or more ran, the least-loaded
replica's share of the shared port's open connections (``ss``, every 0.5 s: a replica that
started mid-phase gets no kept-alive connection), then the totals of every scenario side by
side.
The scenarios: ``--close-grace`` (default 0 and 0.5 s: how long a stopping replica keeps its
connections open after closing its socket, ``shared_close_grace_s``) times, with
``--migrate-req both`` (the default where this process may write
``/proc/sys/net/ipv4/tcp_migrate_req``, as root), that switch 0 and 1 (restored after). Without
the switch a closing socket's waiting connections are reset; without the grace, a connection
accepted just before the stop is closed before its request is read. ``--connection-age``
(default ``none``) runs each scenario with those ``max_connection_age_s`` too (``none``: no
limit): with kept-alive clients, what spreads their connections over a replica started since.

    python benchmarks/bench_autoscaling.py                       # 4 scenarios, ~7 minutes
    python benchmarks/bench_autoscaling.py --migrate-req keep --phases 64:10,4:15
    python benchmarks/bench_autoscaling.py --connections keepalive --migrate-req 1 \
        --close-grace 0.5 --connection-age none 2
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_cluster import MODEL, ray_serve, reversal_artifact  # noqa: E402
from load_clients import LeanConnection, request_body  # noqa: E402
from machine import describe  # noqa: E402

import serving  # noqa: E402
from serving.settings import MAX_CONNECTION_AGE_S, is_no_limit  # noqa: E402
from serving.shared_port import MIGRATE_REQ, migrates_queued_connections  # noqa: E402

#: Ray's autoscaling timing for the run: short, so that a phase of seconds moves the replicas.
TIMING = {
    "metrics_interval_s": 0.5,
    "look_back_period_s": 2,
    "upscale_delay_s": 1,
    "downscale_delay_s": 3,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--phases", default="64:12,12:12,64:12,12:12,64:12,12:12", help="CLIENTS:SECONDS,..."
    )
    parser.add_argument("--max-replicas", type=int, default=2)
    parser.add_argument(
        "--target", type=float, default=16.0, help="target_ongoing_requests per replica"
    )
    parser.add_argument("--connections", choices=("fresh", "keepalive"), default="fresh")
    parser.add_argument(
        "--close-grace",
        type=float,
        nargs="+",
        default=[0.0, 0.5],
        help="shared_close_grace_s values to run (0: a stopping replica closes its idle "
        "connections at once, as uvicorn does)",
    )
    parser.add_argument(
        "--connection-age",
        nargs="+",
        default=["none"],
        help="max_connection_age_s values to run (none: no limit)",
    )
    writable = os.access(MIGRATE_REQ, os.W_OK)
    parser.add_argument(
        "--migrate-req",
        choices=("both", "0", "1", "keep"),
        default="both" if writable else "keep",
        help="run with net.ipv4.tcp_migrate_req 0 then 1, or 0 or 1 only (root), or as it is",
    )
    args = parser.parse_args(argv)
    try:
        ages = args.connection_age
        args.connection_age = [None if is_no_limit(age) else float(age) for age in ages]
        if any(
            age is not None and not 0 < age <= MAX_CONNECTION_AGE_S for age in args.connection_age
        ):
            raise ValueError
    except ValueError:
        parser.error(
            f"--connection-age takes none or seconds in (0, {MAX_CONNECTION_AGE_S:g}], "
            f"got {args.connection_age}"
        )
    if args.migrate_req not in ("keep", "both") and not writable:
        parser.error(f"--migrate-req {args.migrate_req} sets {MIGRATE_REQ}: run as root")
    try:
        args.phases = [tuple(int(x) for x in p.split(":")) for p in args.phases.split(",")]
        if any(len(p) != 2 or min(p) < 1 for p in args.phases):
            raise ValueError
    except ValueError:
        parser.error(f"--phases must be CLIENTS:SECONDS,... with both >= 1, got {args.phases!r}")
    if args.max_replicas < 2:
        parser.error("--max-replicas must be >= 2: one replica cannot scale")
    return args


class ReplicaCount(threading.Thread):
    """Ray's count of running replicas, read every 0.5 s: ``(seconds, replicas)`` changes."""

    def __init__(self, started: float) -> None:
        super().__init__(daemon=True)
        self.started, self.changes, self.done = started, [], threading.Event()

    def now(self) -> int:
        return self.changes[-1][1] if self.changes else 0

    def read(self) -> None:
        from ray import serve

        (deployment,) = serve.status().applications["bench"].deployments.values()
        running = deployment.replica_states.get("RUNNING", 0)
        if running != self.now():
            self.changes.append((time.monotonic() - self.started, running))

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.read()


def connections_per_process(port: int) -> collections.Counter:
    """The established TCP connections whose local port is ``port``, by owning process id
    (``ss -tnp``: the server's side of each connection; every process's, as root); empty
    without ``ss``."""
    if shutil.which("ss") is None:
        return collections.Counter()
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    return collections.Counter(m.group(1) for m in re.finditer(r"pid=(\d+)", out))


def least_share(per_process: collections.Counter, replicas: int) -> float | None:
    """The least-loaded of ``replicas`` replicas' share of the connections (a replica with
    none counts as 0); None without connections."""
    total = sum(per_process.values())
    if not total:
        return None
    counts = sorted(per_process.values()) if len(per_process) >= replicas else [0]
    return counts[0] / total


async def phase(
    infer: str, expected: dict[str, str], clients: int, seconds: float, fresh: bool,
    counts: ReplicaCount,
) -> dict:  # fmt: skip
    """``clients`` one-item clients for ``seconds`` (``fresh``: a new connection a request);
    what they saw, and the replica counts Ray reported meanwhile."""
    sources = list(expected)
    row = {"clients": clients, "seconds": seconds, "requests": 0, "wrong": 0}
    row["errors"], row["replicas"], shares = collections.Counter(), {counts.now()}, []
    port = int(infer.split(":")[2].split("/")[0])
    stop = time.monotonic() + seconds

    async def client(index: int) -> None:
        connection, i = LeanConnection(infer), index
        try:
            while time.monotonic() < stop:
                source = sources[i % len(sources)]
                i += clients
                try:
                    status, content = await connection.post(request_body(source))
                except ConnectionError as error:  # "ConnectionResetError: ..."
                    row["errors"][str(error).split(":")[0]] += 1
                    continue
                finally:
                    if fresh:
                        await connection.aclose()
                row["requests"] += 1
                if status != 200:
                    row["errors"][f"HTTP {status}"] += 1
                elif f'"{expected[source]}"' not in content.decode():
                    row["wrong"] += 1
        finally:
            await connection.aclose()

    async def watch() -> None:
        while time.monotonic() < stop:
            running = counts.now()
            row["replicas"].add(running)
            if running >= 2:
                per_process = await asyncio.to_thread(connections_per_process, port)
                if (share := least_share(per_process, running)) is not None:
                    shares.append(share)
            await asyncio.sleep(0.5)

    await asyncio.gather(watch(), *(client(i) for i in range(clients)))
    row["replicas"].add(counts.now())
    row["least_share"] = statistics.fmean(shares) if shares else None
    return row


async def run_phases(url: str, args: argparse.Namespace, counts: ReplicaCount) -> list[dict]:
    """The phases, one after another; what each saw."""
    letters = "abcdefghij"  # the model's alphabet
    sources = ["".join(letters[(n + k) % 10] for k in range(1 + n % 9)) for n in range(50)]
    expected = dict(zip(sources, serving.load(args.model_dir).predict(sources), strict=True))
    infer, fresh = f"{url}/v2/models/{MODEL}/infer", args.connections == "fresh"
    return [
        await phase(infer, expected, clients, seconds, fresh, counts)
        for clients, seconds in args.phases
    ]


def scenario(args: argparse.Namespace, grace: float, age: float | None) -> tuple[list[str], dict]:
    """One Ray Serve app, the phases against its shared port; the scenario's table, and its
    totals (answered, errors, wrong answers, scale-ups and scale-downs)."""
    app = {
        "max_replicas": args.max_replicas, "target_ongoing_requests": args.target,
        "shared_close_grace_s": grace, **TIMING,
    }  # fmt: skip
    if age is not None:
        app["max_connection_age_s"] = age
    # Ray's Python proxy (env {}: unused here), a (logical) CPU for each replica at most: on 2
    # cores, more replicas share them
    cpus = max(2, args.max_replicas)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with ray_serve(args.model_dir, None, {}, shared_port=True, app_args=app, num_cpus=cpus) as url:
        counts = ReplicaCount(time.monotonic())
        counts.read()  # the replicas at the start (serve.run returned: running)
        counts.start()
        rows = asyncio.run(run_phases(url, args, counts))
        counts.done.set()
        counts.join()
    lines = [
        "| phase | clients | seconds | answered | req/s | errors | wrong | replicas seen "
        "| least-loaded replica's share of connections, 2+ running |",
        "|---:|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for i, row in enumerate(rows, 1):
        errors = ", ".join(f"{n} {kind}" for kind, n in row["errors"].most_common()) or "0"
        seen = "-".join(str(n) for n in sorted(row["replicas"]))
        share = "-" if row["least_share"] is None else f"{row['least_share']:.2f}"
        lines.append(
            f"| {i} | {row['clients']} | {row['seconds']} | {row['requests']} | "
            f"{row['requests'] / row['seconds']:,.0f} | {errors} | {row['wrong']} | {seen} "
            f"| {share} |"
        )
    timeline = ", ".join(f"{t:.1f} s: {n}" for t, n in counts.changes)
    lines.append(f"\nrunning replicas (seconds from the first phase: count): {timeline}")
    most = max(row["clients"] for row in rows)
    pairs = itertools.pairwise(counts.changes)
    steps = [new - old for (_, old), (_, new) in pairs]
    totals = {
        "answered": sum(row["requests"] for row in rows),
        "errors": sum(sum(row["errors"].values()) for row in rows),
        "wrong": sum(row["wrong"] for row in rows),
        "ups": sum(step > 0 for step in steps), "downs": sum(step < 0 for step in steps),
        "many": [row["least_share"] for row in rows if row["clients"] == most],
    }  # fmt: skip
    return lines, totals


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(describe())
    print(
        f"phases {args.phases}, max_replicas {args.max_replicas}, target_ongoing_requests "
        f"{args.target}, {args.connections} connections, Ray's timing {TIMING}"
    )
    settings = {"both": ["0", "1"], "keep": [None]}.get(args.migrate_req, [args.migrate_req])
    saved = MIGRATE_REQ.read_text() if args.migrate_req != "keep" else None
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        args.model_dir = reversal_artifact(Path(tmp))
        try:
            for setting in settings:
                if setting is not None:
                    MIGRATE_REQ.write_text(setting)
                state = {True: "1", False: "0", None: "unknown"}[migrates_queued_connections()]
                for grace, age in itertools.product(args.close_grace, args.connection_age):
                    print(
                        f"\n## net.ipv4.tcp_migrate_req = {state}, close grace {grace} s, "
                        f"max_connection_age_s {age}\n"
                    )
                    lines, totals = scenario(args, grace, age)
                    print("\n".join(lines), flush=True)
                    summary.append((state, grace, age, totals))
        finally:
            if saved is not None:
                MIGRATE_REQ.write_text(saved)
    print("\n## side by side\n")
    print("| tcp_migrate_req | close grace (s) | connection age (s) | scale-ups | scale-downs "
          "| answered | errors | errors per scale-down | wrong | least-loaded replica's share, "
          "busiest phases |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for state, grace, age, t in summary:
        per_down = f"{t['errors'] / t['downs']:.1f}" if t["downs"] else "-"
        shares = ", ".join("-" if x is None else f"{x:.2f}" for x in t["many"])
        print(
            f"| {state} | {grace} | {'none' if age is None else age} | {t['ups']} | {t['downs']} "
            f"| {t['answered']} | {t['errors']} | {per_down} | {t['wrong']} | {shares} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
