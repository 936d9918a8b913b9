"""Load test of the server as deployed: dynamic and continuous batching against
``--max-batch-size 1``.

Starts ``python -m serving`` once per mode (``--modes``: ``batched``, dynamic batching;
``unbatched``, ``--max-batch-size 1``; ``continuous``, ``--batching continuous``, for the
models that can run it: greedy RNN decoders; ``aged``, not run by default, dynamic batching with
``--max-connection-age-s`` at ``--connection-age``: what the reconnections cost), all up at
once, and drives each in turn with one-item requests at several concurrencies (default 1, 8, 64
and 256), the modes of a level back to back and taking turns at going first. ``--repeats N``
measures each level N times, the modes' order flipped each time, and takes the ratios from the
medians: the way to tell a difference at concurrency 1 from the noise of one short window. The
server is confined to one core and the load generator to another (``os.sched_setaffinity``;
``--no-pin`` turns it off), so that the figures are the server's and not the client's. For each
level: throughput, p50 and p99 latency, errors, and the server's own CPU time per request
(``/proc/<pid>/stat`` over the measured window), with each mode's ratios to the unbatched
server and continuous against dynamic batching.

Two load generators (``--clients``, :mod:`load_clients`): ``python``, an asyncio + httpx
client in one process (what a Python user's script does; every answer is checked against
``serving.load(model_dir).predict``), and ``wrk`` (Debian's C load generator, one thread, a Lua
script posting v2 JSON). Two source-length mixes (``--mixes``): ``fixed`` (every source 8
tokens) and ``mixed`` (1-30 tokens, uniform), random strings over the model's vocabulary.

Two models, side by side in one run (``--models``):

- ``g2p``: the architecture of ``examples/g2p_cmudict.py`` (bi-GRU of 256 units, Bahdanau
  decoder with additive attention, beam 5), fitted here for ``--g2p-steps`` steps on CMUdict
  training words: a model whose inference is the larger part of a request. The mean output
  length is printed, so that a half-trained model cannot inflate a request's cost unnoticed.
- ``reversal``: a small character-reversal model (hidden 64, greedy), where HTTP and JSON per
  request cost more than the inference: the case batching helps least.

    python benchmarks/bench_server.py                      # everything: about 25 minutes
    python benchmarks/bench_server.py --quick              # reversal, 1 / 8 / 64, ~2 minutes
    python benchmarks/bench_server.py --model-dir DIR --device cuda
    python benchmarks/bench_server.py --models reversal --concurrency 1 --repeats 6 --duration 10

``--paired`` drives a level's modes at once instead of one after the other, ``concurrency``
connections each (:mod:`load_clients`' paired drivers: the Python client's coroutines for every
server in one event loop, or one wrk thread per server), so that the machine's drift falls on
every mode alike while they share the server's core: at concurrency 1 the same server read
198-399 req/s in windows seconds apart, and the ratio of two back-to-back windows 0.75-1.29x.
wrk reports no per-server latency percentiles (n/a).

    python benchmarks/bench_server.py --models reversal --concurrency 1 --repeats 6 --paired

On a machine with one core, or with ``--no-pin``, the client and the server share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx
import machine
import numpy as np
from load_clients import (
    Window,
    drive_python,
    drive_python_paired,
    drive_wrk,
    drive_wrk_paired,
    wrk_available,
)

from serving.settings import MAX_CONNECTION_AGE_S

try:
    import uvloop
except ImportError:  # Windows
    uvloop = None

REPO = Path(__file__).resolve().parents[1]
MODEL = "bench"
#: Distinct sources each benchmark cycles through.
SOURCE_COUNT = 512
#: Source lengths in tokens of each mix.
MIXES = {"fixed": (8, 8), "mixed": (1, 30)}
#: The servers compared: dynamic batching, none, continuous batching, and dynamic batching whose
#: connections close at an age (``--connection-age``; run when named).
MODES = ("batched", "unbatched", "continuous", "aged")
DEFAULT_MODES = MODES[:3]
#: The load generator's event loop: uvloop (which uvicorn[standard] installs) where available,
#: since the client shares the cores with the server under test; else asyncio's own.
CLIENT_LOOP = uvloop.new_event_loop if uvloop is not None else asyncio.new_event_loop


@dataclass
class LevelResult:
    model: str
    mode: str
    client: str
    mix: str
    concurrency: int
    requests: int
    errors: int
    mismatches: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float
    server_cpu_ms: float  # server process CPU time per request, over the measured window
    repeat: int = 0  # which of the level's --repeats windows

    @classmethod
    def of(cls, window: Window, **labels) -> LevelResult:
        def rounded(x: float) -> float:
            return round(x, 3) if math.isfinite(x) else x

        n = max(window.requests, 1)
        return cls(
            **labels,
            requests=window.requests,
            errors=window.errors,
            mismatches=window.mismatches,
            seconds=round(window.seconds, 3),
            throughput=round(window.requests / window.seconds, 1) if window.seconds else 0.0,
            p50_ms=rounded(window.p50_ms),
            p99_ms=rounded(window.p99_ms),
            server_cpu_ms=rounded(1000 * window.server_cpu_s / n),
        )


#: Defaults of the flags that ``--quick`` changes (it changes only the defaults).
DEFAULTS = dict(
    models=["g2p", "reversal"], concurrency=[1, 8, 64, 256], duration=5.0, warmup=1.0,
    server_warmup=3.0,
)  # fmt: skip
QUICK_DEFAULTS = dict(
    models=["reversal"], concurrency=[1, 8, 64], duration=2.0, warmup=1.0, server_warmup=1.0
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=("g2p", "reversal"),
                        help="default: both (--quick: reversal)")  # fmt: skip
    parser.add_argument("--model-dir", type=Path, help="an artifact to serve instead of --models")
    parser.add_argument("--g2p-steps", type=int, default=600, help="training steps of g2p")
    parser.add_argument("--concurrency", type=int, nargs="+",
                        help="default: 1 8 64 256 (--quick: 1 8 64)")  # fmt: skip
    parser.add_argument("--clients", nargs="+", choices=("python", "wrk"),
                        default=["python", "wrk"])  # fmt: skip
    parser.add_argument("--mixes", nargs="+", choices=tuple(MIXES), default=list(MIXES))
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(DEFAULT_MODES),
        help="continuous runs only for models that support it (default: all but aged)",
    )
    parser.add_argument(
        "--connection-age",
        type=float,
        default=1.0,
        help="the aged server's --max-connection-age-s (default: %(default)s)",
    )
    parser.add_argument("--no-pin", action="store_true", help="share the cores, do not pin")
    parser.add_argument("--quick", action="store_true",
                        help="other defaults: reversal only, concurrency 1 8 64, 2 s per level, "
                        "1 s of server warm-up (flags given win)")  # fmt: skip
    parser.add_argument("--duration", type=float, help="seconds per level (default 5)")
    parser.add_argument("--warmup", type=float, help="seconds before measuring (default 1)")
    parser.add_argument(
        "--server-warmup", type=float, help="unmeasured load on each new server (default 3 s)"
    )
    parser.add_argument("--max-batch-size", type=int, default=64, help="of the batching server")
    parser.add_argument("--max-delay-ms", type=float, default=2.0)
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--intra-op-threads", type=int, help="passed to the servers")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paired", action="store_true",
                        help="drive a level's modes at once, in one window, concurrency "
                        "connections each (load_clients' paired drivers)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1,
                        help="windows per level and mode, the modes' order flipped each time; "
                        "ratios from the medians")  # fmt: skip
    args = parser.parse_args(argv)
    for name, value in (QUICK_DEFAULTS if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:  # --quick sets defaults; a flag given wins
            setattr(args, name, value)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if not (math.isfinite(args.connection_age) and 0 < args.connection_age <= MAX_CONNECTION_AGE_S):
        parser.error(
            f"--connection-age must be seconds in (0, {MAX_CONNECTION_AGE_S:g}], "
            f"got {args.connection_age}"
        )
    if min(args.concurrency) < 1:
        parser.error(f"--concurrency must be >= 1, got {min(args.concurrency)}")
    if not (math.isfinite(args.duration) and args.duration > 0):
        parser.error(f"--duration must be a finite number > 0, got {args.duration}")
    for flag, value in (("--warmup", args.warmup), ("--server-warmup", args.server_warmup)):
        if not (math.isfinite(value) and value >= 0):
            parser.error(f"{flag} must be a finite number >= 0, got {value}")
    if "wrk" in args.clients and not wrk_available():
        print("wrk is not installed: the Python client only", file=sys.stderr)
        args.clients = [c for c in args.clients if c != "wrk"]
    return args


# ---------------------------------------------------------------------------------------------
# The model and the sources


def train_reversal_model(directory: Path, seed: int) -> Path:
    """Train a small character-reversal model and export it (needs torch: the training side)."""
    import torch

    from skattn import Seq2Seq

    torch.set_num_threads(1)  # faster for a tiny model on a small, shared machine
    rng = random.Random(seed)
    sources = ["".join(rng.choices("abcdefghij", k=rng.randint(1, 10))) for _ in range(800)]
    model = Seq2Seq(
        embedding_dim=32,
        hidden_size=64,
        max_epochs=10,
        batch_size=64,
        learning_rate=1e-2,
        random_state=seed,
        device="cpu",
        n_threads=1,  # the estimator sets torch's threads for each fit and predict
    )
    return fit_and_export(model, sources, [s[::-1] for s in sources], directory, "a reversal model")


def train_g2p_model(directory: Path, steps: int, seed: int) -> Path:
    """Fit the G2P example's architecture for ``steps`` steps on CMUdict and export it."""
    import torch

    from skattn import Seq2Seq
    from skattn.datasets import load_cmudict

    torch.set_num_threads(os.cpu_count() or 1)  # nothing else runs yet
    words, pronunciations = load_cmudict("train")
    model = Seq2Seq(
        decoder="bahdanau",
        scorer="additive",
        embedding_dim=64,
        hidden_size=256,
        batch_size=64,
        learning_rate=1e-3,
        max_steps=steps,
        early_stopping=False,
        beam_size=5,
        random_state=seed,
        device="cpu",
    )
    label = f"a G2P model for {steps} steps"
    return fit_and_export(model, words, pronunciations, directory, label)


def fit_and_export(model, X: list, y: list, directory: Path, label: str) -> Path:
    """Fit ``model`` on ``(X, y)`` and export it to ``directory``, saying so on stderr."""
    print(f"training {label} ...", file=sys.stderr, flush=True)
    model.fit(X, y)
    model.export_onnx(str(directory))
    print(f"exported to {directory}", file=sys.stderr, flush=True)
    return directory


def read_manifest(model_dir: Path) -> dict:
    return json.loads((model_dir / "manifest.json").read_text())


def random_sources(model_dir: Path, count: int, lengths: tuple[int, int], seed: int) -> list:
    """Random sources over the model's source vocabulary (read from its manifest), of
    ``lengths[0]..lengths[1]`` tokens."""
    manifest = read_manifest(model_dir)
    alphabet = [t for t in manifest["source_vocabulary"][4:] if t.strip()]  # skip the specials
    joiner = "" if manifest["tokenizer"] == "char" else " "
    low, high = (min(n, int(manifest["limits"]["max_source_length"])) for n in lengths)
    rng = random.Random(seed)
    return [joiner.join(rng.choices(alphabet, k=rng.randint(low, high))) for _ in range(count)]


def prepare(name: str, scratch: Path, args: argparse.Namespace) -> tuple[Path, str]:
    """The artifact to serve, and a line describing it."""
    if name == "dir":
        return args.model_dir, str(args.model_dir)
    if name == "reversal":
        model_dir = train_reversal_model(scratch / "reversal", args.seed)
        return model_dir, "bi-GRU 64, greedy, trained on 1-10 letters"
    model_dir = train_g2p_model(scratch / "g2p", args.g2p_steps, args.seed)
    return model_dir, (
        f"bi-GRU 256, Bahdanau/additive, beam 5, {args.g2p_steps} training steps on CMUdict"
    )


def expected_predictions(model_dir: Path, sources: list[str], device: str) -> dict[str, str]:
    """The unbatched answers (one source per runtime call), the reference for every response."""
    import serving

    runtime = serving.load(model_dir, device=device)
    return {s: _as_text(runtime.predict([s])[0]) for s in sorted(set(sources))}


def mean_output_length(expected: dict[str, str], model_dir: Path) -> float:
    """Mean length of the expected answers in output tokens."""
    manifest = read_manifest(model_dir)
    tokens = manifest["output_kind"] == "tokens" or manifest["tokenizer"] == "space"
    return float(np.mean([len(a.split()) if tokens else len(a) for a in expected.values()]))


def _as_text(prediction) -> str:
    return prediction if isinstance(prediction, str) else " ".join(prediction)


# ---------------------------------------------------------------------------------------------
# The server under test


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(model_dir: Path, mode: str, args: argparse.Namespace):
    port = free_port()
    max_batch_size = 1 if mode == "unbatched" else args.max_batch_size
    command = [
        sys.executable, "-m", "serving",
        "--model-dir", str(model_dir), "--model-name", MODEL, "--port", str(port),
        "--max-batch-size", str(max_batch_size), "--max-delay-ms", str(args.max_delay_ms),
        "--batching", "continuous" if mode == "continuous" else "dynamic",
        "--device", args.device, "--log-level", "warning",
    ]  # fmt: skip
    if args.intra_op_threads is not None:
        command += ["--intra-op-threads", str(args.intra_op_threads)]
    if mode == "aged":
        command += ["--max-connection-age-s", str(args.connection_age)]
    cpus = None if args.no_pin else args.server_cpus

    def pin() -> None:  # in the child, before exec: every thread the server starts inherits it
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True, preexec_fn=pin)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {process.stderr.read()}")
            try:
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.returncode != 0:
            print(f"server exited with {process.returncode}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# The runs

HEADER = (
    f"{'model':<9}{'mode':<11}{'client':<7}{'mix':<6}{'conc':>5}{'requests':>9}{'errors':>7}"
    f"{'wrong':>6}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'server cpu ms/req':>18}"
)


def print_table(results: list[LevelResult], header: bool = True) -> None:
    if header:
        print(HEADER)
    for r in results:
        print(
            f"{r.model:<9}{r.mode:<11}{r.client:<7}{r.mix:<6}{r.concurrency:>5}{r.requests:>9}"
            f"{r.errors:>7}{r.mismatches:>6}{r.throughput:>9.1f}{r.p50_ms:>9.2f}"
            f"{r.p99_ms:>9.2f}{r.server_cpu_ms:>18.3f}",
            flush=True,
        )


def run_level(client, url, pid, sources, expected, concurrency, args) -> Window:
    """One measured window: ``client`` is ``"wrk"``, ``"python"`` (one transport per
    coroutine) or ``"httpx"`` (one shared ``httpx.AsyncClient``, as a user's script has it)."""
    if client == "wrk":
        path = f"/v2/models/{MODEL}/infer"
        return drive_wrk(url, path, sources, concurrency, args.duration, args.warmup, pid)
    level = drive_python(
        f"{url}/v2/models/{MODEL}/infer", sources, expected, concurrency, args.duration,
        args.warmup, pid, stock=client == "httpx",
    )  # fmt: skip
    with asyncio.Runner(loop_factory=CLIENT_LOOP) as runner:
        return runner.run(level)


def run_paired(client, servers, sources, expected, concurrency, args) -> list[Window]:
    """One window measuring every server of ``servers`` (``(url, pid)`` pairs) at once."""
    pids = [pid for _, pid in servers]
    if client == "wrk":
        path = f"/v2/models/{MODEL}/infer"
        return drive_wrk_paired(
            [url for url, _ in servers], path, sources, concurrency, args.duration,
            args.warmup, pids,
        )  # fmt: skip
    urls = [f"{url}/v2/models/{MODEL}/infer" for url, _ in servers]
    level = drive_python_paired(
        urls, sources, expected, concurrency, args.duration, args.warmup, pids
    )
    with asyncio.Runner(loop_factory=CLIENT_LOOP) as runner:
        return runner.run(level)


def warm_up(url, pid, sources, expected, args) -> None:
    """Unmeasured load on a new server (8 clients for ``--server-warmup`` s): its first seconds
    (allocator arenas growing, first calls of each code path) are not a deployment's steady
    state, and would otherwise fall on the first measured level alone (concurrency 1 of the
    batched server ran at 0.75-0.91x of the unbatched one's that way, and 0.99x in a longer
    window)."""
    if args.server_warmup > 0:
        run_level("python", url, pid, sources, expected, 8, argparse.Namespace(
            duration=args.server_warmup, warmup=0.0))  # fmt: skip


def bench_model(name: str, model_dir: Path, args: argparse.Namespace) -> list[LevelResult]:
    """Every mode's server (all up, on the same core), every mix, client and concurrency; at
    each level the modes are measured back to back."""
    mixes = {}
    for mix in args.mixes:
        sources = random_sources(model_dir, SOURCE_COUNT, MIXES[mix], args.seed)
        expected = expected_predictions(model_dir, sources, args.device)
        mean = mean_output_length(expected, model_dir)
        print(f"# {name}, {mix} sources: {mean:.2f} output tokens on average", flush=True)
        mixes[mix] = sources, expected
    results = []
    modes = list(args.modes)
    import serving
    from serving.running import continuous_support

    reason = continuous_support(serving.load(model_dir, device=args.device))
    if "continuous" in modes and reason is not None:
        print(f"# {name}: no continuous batching: {reason}", flush=True)
        modes.remove("continuous")
    print(HEADER)
    with contextlib.ExitStack() as stack:  # every server up at once, driven one at a time
        servers = {m: stack.enter_context(running_server(model_dir, m, args)) for m in modes}
        for url, pid in servers.values():
            warm_up(url, pid, *next(iter(mixes.values())), args)
        # The modes of a level run back to back; at each concurrency they take turns at going
        # first (turn = which mix and client), so that none always meets the machine in the
        # state another left it in.
        for turn, (mix, client) in enumerate(itertools.product(mixes, args.clients)):
            sources, expected = mixes[mix]
            for concurrency in args.concurrency:
                for repeat in range(args.repeats):
                    order = mode_order(modes, turn, repeat)
                    if args.paired:
                        windows = run_paired(
                            client, [servers[m] for m in order], sources, expected,
                            concurrency, args,
                        )  # fmt: skip
                    else:
                        windows = [
                            run_level(client, *servers[m], sources, expected, concurrency, args)
                            for m in order
                        ]
                    for mode, window in zip(order, windows, strict=True):
                        labels = dict(model=name, mode=mode, client=client, mix=mix)
                        results.append(
                            LevelResult.of(window, concurrency=concurrency, repeat=repeat, **labels)
                        )
                        print_table([results[-1]], header=False)
    return results


def mode_order(modes: list[str], turn: int, repeat: int) -> list[str]:
    """The order in which a level's modes run: reversed on every other turn (mix and client)
    and flipped again on every other repeat, so that no mode always goes first."""
    return list(modes) if (turn + repeat) % 2 == 0 else list(modes)[::-1]


def median_results(results: list[LevelResult]) -> dict[tuple, LevelResult]:
    """(model, client, mix, concurrency, mode) -> that level's result over its windows
    (``--repeats``): the median throughput, p50, p99 and server CPU per request, the summed
    requests, errors, mismatches and seconds."""
    groups: dict[tuple, list[LevelResult]] = {}
    for r in results:
        groups.setdefault((r.model, r.client, r.mix, r.concurrency, r.mode), []).append(r)
    medians = {}
    for key, windows in groups.items():
        medians[key] = replace(
            windows[0],
            throughput=statistics.median(w.throughput for w in windows),
            p50_ms=statistics.median(w.p50_ms for w in windows),
            p99_ms=statistics.median(w.p99_ms for w in windows),
            server_cpu_ms=statistics.median(w.server_cpu_ms for w in windows),
            requests=sum(w.requests for w in windows),
            errors=sum(w.errors for w in windows),
            mismatches=sum(w.mismatches for w in windows),
            seconds=round(sum(w.seconds for w in windows), 3),
        )
    return medians


def print_ratios(results: list[LevelResult]) -> None:
    """Each mode against the unbatched server, continuous and aged against dynamic batching, at
    each level (the median of its windows): throughput, server CPU per request and p99."""
    by_key = median_results(results)
    pairs = [
        ("batched", "unbatched"), ("continuous", "unbatched"), ("continuous", "batched"),
        ("aged", "batched"),
    ]  # fmt: skip
    for mode, base_mode in pairs:
        lines = []
        for (model, client, mix, concurrency, m), result in by_key.items():
            base = by_key.get((model, client, mix, concurrency, base_mode))
            if m != mode or base is None:
                continue
            speed = result.throughput / base.throughput if base.throughput else math.inf
            cpu = result.server_cpu_ms / base.server_cpu_ms if base.server_cpu_ms else 0
            p99 = result.p99_ms / base.p99_ms if base.p99_ms else math.inf
            p99_text = f"{p99:8.2f}x" if not math.isnan(p99) else "     n/a"  # paired wrk
            lines.append(
                f"{model:<9}{client:<7}{mix:<6}{concurrency:>5}:  {speed:8.2f}x  {cpu:12.3f}x "
                f"{p99_text}"
            )
        if lines:
            print(f"{mode} / {base_mode}:".ljust(27) + "req/s   server cpu/req   p99")
            print("\n".join(lines))


def choose_cpus(args: argparse.Namespace) -> None:
    """The server's core and the load generator's: the first two this process may use."""
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(usable) < 2:
        args.no_pin = True
    args.server_cpus, args.client_cpus = ({usable[0]}, {usable[1]}) if not args.no_pin else (
        None, None)  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    host = machine.describe()  # before the load generator is pinned to its core
    choose_cpus(args)
    names = ["dir"] if args.model_dir else args.models
    results, descriptions = [], []
    with tempfile.TemporaryDirectory() as scratch:
        prepared = [(name, *prepare(name, Path(scratch), args)) for name in names]
        if not args.no_pin:  # training and exports used every core; the load generator one
            os.sched_setaffinity(0, args.client_cpus)
        for name, model_dir, description in prepared:
            descriptions.append(f"# {name}: {description}")
            print(descriptions[-1], flush=True)
            results += bench_model(name, model_dir, args)
    pinning = "shared cores" if args.no_pin else (
        f"server on cpu {sorted(args.server_cpus)}, load generator on {sorted(args.client_cpus)}"
    )  # fmt: skip
    print(
        f"\n{host}\n"
        f"device: {args.device}  cores: {os.cpu_count()}  {pinning}  max_batch_size: "
        f"{args.max_batch_size}  max_delay_ms: {args.max_delay_ms}  {args.duration:g} s per level"
        f"  python client loop: {'uvloop' if uvloop is not None else 'asyncio'}"
    )
    print("\n".join(descriptions) + "\n")
    print_table(results)
    print()
    print_ratios(results)
    failures = sum(r.errors + r.mismatches for r in results)
    print(f"errors + mismatched answers: {failures}")
    if args.json:
        rows = [  # NaN (paired wrk's percentiles) as null: bare NaN is not JSON
            {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(r).items()}
            for r in results
        ]
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
