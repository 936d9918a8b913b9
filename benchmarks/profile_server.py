"""Where a served request's time goes, batched against unbatched: py-spy inside the server.

Issue 17's question: with a Python client (one process, many coroutines) the batched server
answered fewer requests per second than the unbatched one. This script serves one artifact
twice (``--max-batch-size`` N, then 1), confined to one core, drives it from the other core with
``bench_server``'s Python client (or a stock ``httpx.AsyncClient``, or ``wrk``) at one
concurrency after 3 s of unmeasured load, and records for the measured window:

- req/s, p50 / p99, errors and wrong answers (the Python clients check every answer; wrk
  counts errors only);
- the server's CPU time per request and the **client's** CPU time per request (this process,
  ``os.times``), and how busy each was (CPU seconds / wall seconds): a side at ~100 % is the
  bottleneck, and a busy client caps what any server can show;
- batches and items from the server's ``/metrics``: mean batch size and the share of batches
  of one item, the runtime's seconds, and the mean queue wait;
- py-spy (``py-spy record --nonblocking``, 100 Hz) on the server: per thread, the share of
  samples in which it ran and in which it held the GIL, and the functions that took most of
  the samples (own time).

    python benchmarks/profile_server.py                         # reversal model, c=64, 8 s
    python benchmarks/profile_server.py --model-dir DIR --concurrency 8 --client wrk
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
from bench_server import (
    MIXES,
    SOURCE_COUNT,
    choose_cpus,
    expected_predictions,
    prepare,
    random_sources,
    run_level,
    running_server,
    warm_up,
)
from load_clients import wrk_available

METRICS = re.compile(r"^(skattn_\w+?)(?:_(sum|count))?\{([^}]*)\}\s+([0-9.e+-]+)$")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="an artifact (default: a reversal model)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--client", choices=("python", "httpx", "wrk"), default="python",
                        help="python: bench_server's client; httpx: one AsyncClient")  # fmt: skip
    parser.add_argument("--mix", choices=tuple(MIXES), default="fixed")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-delay-ms", type=float, default=2.0)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=8, help="functions listed per thread")
    parser.add_argument("--no-py-spy", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.client == "wrk" and not wrk_available():
        parser.error("--client wrk: wrk is not installed (Debian: apt-get install wrk)")
    args.no_pin, args.device, args.intra_op_threads, args.g2p_steps = False, "cpu", None, 600
    args.server_warmup = 3.0  # unmeasured load on each new server (bench_server.warm_up)
    return args


def metrics(url: str) -> dict[str, float]:
    """The server's series: ``{name: value}``, histograms as ``name_sum`` / ``name_count``,
    and ``batch_ones``: the batches of one item (the batch-size histogram's first bucket)."""
    values: dict[str, float] = collections.defaultdict(float)
    response = httpx.get(f"{url}/metrics", timeout=30)
    response.raise_for_status()  # a 503 (connections full) must not read as no batches
    for line in response.text.splitlines():
        if match := METRICS.match(line):
            name, part, labels, value = match.groups()
            values[f"{name}_{part}" if part else name] += float(value)
            if name == "skattn_batch_size_bucket" and 'le="1.0"' in labels:
                values["batch_ones"] += float(value)
    return values


def py_spy() -> str:
    """The py-spy executable: beside this Python (a virtual environment's), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed (pip install py-spy), or pass --no-py-spy")
    return found


def start_py_spy(pid: int, args: argparse.Namespace, out: Path, gil: bool) -> subprocess.Popen:
    command = [
        py_spy(), "record", "--pid", str(pid), "--format", "raw",
        "--threads", "--nonblocking", "--rate", str(args.rate), "--output", str(out),
        "--duration", str(int(args.duration + args.warmup)),
    ] + (["--gil"] if gil else [])  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def read_stacks(path: Path) -> dict[str, collections.Counter]:
    """Samples per thread: ``{thread: Counter({leaf function: samples})}`` (empty without the
    file: py-spy did not run)."""
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    if not path.exists():
        return threads
    for line in path.read_text().splitlines():  # "thread (12): name;f (a.py:1);g (b.py:2) 49"
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        head = re.match(r"thread \((\w+)\)(?::\s*(.+))?$", frames[0])  # "thread (12): name"
        thread = (head.group(2) or f"thread {head.group(1)}") if head else frames[0]
        leaf = re.sub(r"\s*\(.*?\)", "", frames[-1])  # "fn (file.py:12)" -> "fn"
        where = re.search(r"\(([^:()]+)", frames[-1])
        name = f"{leaf} ({Path(where.group(1)).name})" if where else leaf
        threads[thread][name] += int(count)
    return threads


def run_mode(mode, model_dir, sources, expected, args, scratch) -> dict:
    with running_server(model_dir, mode, args) as (url, pid):
        warm_up(url, pid, sources, expected, args)  # a new server's first seconds
        spies = []
        if not args.no_py_spy:
            spies = [
                start_py_spy(pid, args, scratch / f"{mode}-{kind}.txt", kind == "gil")
                for kind in ("all", "gil")
            ]
        # /metrics read when the measured window starts, after the warm-up's load (read before
        # it, the batch columns counted the warm-up too: 1.5x the window's requests at 1 s)
        before: dict[str, float] = {}
        failed: list[BaseException] = []

        def snapshot() -> None:
            try:
                before.update(metrics(url))
            except Exception as error:  # re-raised below, in this thread
                failed.append(error)

        timer = threading.Timer(args.warmup, snapshot)
        client_before = os.times()
        timer.start()
        try:
            window = run_level(
                args.client, url, pid, sources, expected, args.concurrency, args
            )  # fmt: skip
        finally:
            timer.cancel()
            timer.join()
        if failed or not before:  # else the batch columns would count the warm-up again
            raise RuntimeError(f"/metrics could not be read as the window started: {failed}")
        client_after, after = os.times(), metrics(url)
        for spy in spies:
            try:
                _, err = spy.communicate(timeout=args.duration + args.warmup + 30)
            except subprocess.TimeoutExpired:
                spy.kill()
                _, err = spy.communicate()
            if spy.returncode != 0:  # e.g. no ptrace permission: say so, not empty tables
                print(f"py-spy failed ({spy.returncode}): {err.strip()[-300:]}", file=sys.stderr)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    seconds = args.warmup + window.seconds  # the client's CPU covers the warm-up too
    # this process's user + system time, and wrk's (a child, waited for by then)
    client_cpu = sum(client_after[:4]) - sum(client_before[:4])
    batches = delta.get("skattn_batch_size_count", 0.0)
    items = delta.get("skattn_batch_size_sum", 0.0)
    return dict(
        mode=mode,
        requests=window.requests,
        errors=window.errors + window.mismatches,
        req_s=window.requests / window.seconds,
        p50=window.p50_ms,
        p99=window.p99_ms,
        server_ms=1000 * window.server_cpu_s / max(window.requests, 1),
        server_busy=window.server_cpu_s / window.seconds,
        client_ms=1000 * client_cpu / max(window.requests * seconds / window.seconds, 1),
        client_busy=client_cpu / seconds,
        batches=batches,
        mean_batch=items / batches if batches else float("nan"),
        ones=delta.get("batch_ones", 0.0),
        runtime_s=delta.get("skattn_inference_seconds_sum", 0.0),
        wait_ms=1000 * delta.get("skattn_queue_wait_seconds_sum", 0.0) / max(items, 1),
        stacks={k: read_stacks(scratch / f"{mode}-{k}.txt") for k in ("all", "gil")},
    )


def report(rows: list[dict], args: argparse.Namespace) -> None:
    print(
        "\n| mode | req/s | p50 ms | p99 ms | server CPU ms/req | server busy | client CPU "
        "ms/req | client busy | batches | of one item | mean batch | runtime s | queue wait ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['req_s']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
            f"{r['server_ms']:.2f} | {r['server_busy']:.0%} | {r['client_ms']:.2f} | "
            f"{r['client_busy']:.0%} | {r['batches']:.0f} | {r['ones']:.0f} | "
            f"{r['mean_batch']:.2f} | {r['runtime_s']:.2f} | {r['wait_ms']:.2f} |"
        )
    batched, unbatched = rows

    def ratio(key: str) -> str:
        return f"{batched[key] / unbatched[key]:.2f}x" if unbatched[key] else "n/a"

    print(
        f"\nbatched / unbatched: req/s {ratio('req_s')}, server CPU per request "
        f"{ratio('server_ms')}, client CPU per request {ratio('client_ms')}; errors + wrong "
        f"answers {batched['errors'] + unbatched['errors']}"
    )
    if args.no_py_spy:
        return
    samples = args.rate * (args.duration + args.warmup)
    for r in rows:
        print(f"\n## py-spy, {r['mode']} server ({samples:.0f} samples per thread at most)")
        every, gil = r["stacks"]["all"], r["stacks"]["gil"]
        for thread, counter in sorted(every.items(), key=lambda kv: -sum(kv[1].values())):
            ran, held = sum(counter.values()), sum(gil.get(thread, {}).values())
            print(f"- {thread}: ran {ran / samples:.0%}, held the GIL {held / samples:.0%}")
            for name, count in counter.most_common(args.top):
                print(f"    {count / samples:6.1%}  {name}")


def main(argv=None) -> int:
    args = parse_args(argv)
    choose_cpus(args)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model_dir = args.model_dir or prepare("reversal", scratch, args)[0]
        sources = random_sources(model_dir, SOURCE_COUNT, MIXES[args.mix], args.seed)
        expected = expected_predictions(model_dir, sources, args.device)
        if not args.no_pin:  # the client (and wrk, py-spy) on the core the server does not use
            os.sched_setaffinity(0, args.client_cpus)
        rows = [
            run_mode(mode, model_dir, sources, expected, args, scratch)
            for mode in ("batched", "unbatched")
        ]
    where = "server, client and py-spy share the cores" if args.no_pin else (
        f"server on cpu {sorted(args.server_cpus)}, client and py-spy on "
        f"{sorted(args.client_cpus)}"
    )  # fmt: skip
    print(
        f"# {args.client} client, concurrency {args.concurrency}, {args.mix} sources, "
        f"{args.duration:g} s; {where}"
    )
    report(rows, args)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
