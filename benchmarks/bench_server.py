"""Load test of the server: dynamic batching against ``--max-batch-size 1``.

Starts ``python -m serving`` as a subprocess, once with dynamic batching and once without, and
drives each with one-item requests from an asyncio + httpx load generator (one connection per
simulated user, through httpx's transport layer, the cheapest part of httpx) at several
concurrencies (default 1, 8 and 64): throughput, p50 and p99 latency, errors, and the ratios
of the two servers. Every answer is checked against ``serving.load(model_dir).predict``.

Two models, side by side in one run (``--models``):

- ``g2p``: the architecture of ``examples/g2p_cmudict.py`` (bi-GRU of 256 units, Bahdanau
  decoder with additive attention, beam 5), fitted here for ``--g2p-steps`` steps on CMUdict
  training words and queried with CMUdict test words: a model whose inference is the larger
  part of a request, as a served model's usually is. The mean output length is printed beside
  the references' so that a half-trained model cannot inflate the cost of a request unnoticed.
- ``reversal``: a small character-reversal model (hidden 64, greedy) queried with random
  strings, where HTTP and JSON per request cost more than the inference: the case batching
  helps least.

    python benchmarks/bench_server.py                      # both models, about 4 minutes
    python benchmarks/bench_server.py --models reversal --duration 3
    python benchmarks/bench_server.py --model-dir DIR --words cmudict --device cuda

The client and the server share the machine, so on 2 cores the figures are what one client
process can drive through one server process, not the server's ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

try:
    import uvloop
except ImportError:  # Windows
    uvloop = None

REPO = Path(__file__).resolve().parents[1]
MODEL = "bench"
#: Distinct sources each benchmark cycles through.
SOURCE_COUNT = 512
JSON_HEADERS = {"content-type": "application/json"}
#: The load generator's event loop: uvloop (which uvicorn[standard] installs) where available,
#: since the client shares the cores with the server under test; else asyncio's own.
CLIENT_LOOP = uvloop.new_event_loop if uvloop is not None else asyncio.new_event_loop


@dataclass
class LevelResult:
    model: str
    mode: str
    concurrency: int
    requests: int
    errors: int
    mismatches: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float
    server_cpu_ms: float = float("nan")  # server process CPU time per request
    client_cpu_ms: float = float("nan")  # load generator CPU time per request


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="+", choices=("g2p", "reversal"), default=["g2p", "reversal"]
    )
    parser.add_argument("--model-dir", type=Path, help="an artifact to serve instead of --models")
    parser.add_argument(
        "--words", choices=("random", "cmudict"), default="random",
        help="with --model-dir: random strings over its vocabulary, or CMUdict test words",
    )  # fmt: skip
    parser.add_argument("--g2p-steps", type=int, default=600, help="training steps of g2p")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per level")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--max-batch-size", type=int, default=64, help="of the batching server")
    parser.add_argument("--max-delay-ms", type=float, default=2.0)
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--intra-op-threads", type=int, help="passed to the servers")
    parser.add_argument("--max-length", type=int, default=12, help="longest source, in tokens")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


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


def random_sources(model_dir: Path, count: int, max_length: int, seed: int) -> list[str]:
    """Random sources over the model's source vocabulary (read from its manifest)."""
    manifest = read_manifest(model_dir)
    alphabet = [t for t in manifest["source_vocabulary"][4:] if t.strip()]  # skip the specials
    joiner = "" if manifest["tokenizer"] == "char" else " "
    limit = min(max_length, int(manifest["limits"]["max_source_length"]))
    rng = random.Random(seed)
    return [joiner.join(rng.choices(alphabet, k=rng.randint(1, limit))) for _ in range(count)]


def cmudict_sources(count: int, seed: int) -> tuple[list[str], float]:
    """``count`` distinct CMUdict test words, and their references' mean length in phonemes."""
    from skattn.datasets import group_pronunciations, load_cmudict

    words, references = group_pronunciations(*load_cmudict("test"))
    chosen = random.Random(seed).sample(range(len(words)), count)
    lengths = [np.mean([len(r) for r in references[i]]) for i in chosen]
    return [words[i] for i in chosen], float(np.mean(lengths))


def prepare(name: str, scratch: Path, args: argparse.Namespace) -> tuple[Path, list[str], str]:
    """The artifact to serve, the sources to send, and a line describing them."""
    if name == "dir":
        model_dir = args.model_dir
        if args.words == "cmudict":
            sources, _ = cmudict_sources(SOURCE_COUNT, args.seed)
        else:
            sources = random_sources(model_dir, SOURCE_COUNT, args.max_length, args.seed)
        return model_dir, sources, f"{model_dir}, {args.words} sources"
    if name == "reversal":
        model_dir = train_reversal_model(scratch / "reversal", args.seed)
        sources = random_sources(model_dir, SOURCE_COUNT, args.max_length, args.seed)
        return model_dir, sources, "reversal: bi-GRU 64, greedy; random strings of 1-10 letters"
    model_dir = train_g2p_model(scratch / "g2p", args.g2p_steps, args.seed)
    sources, reference_length = cmudict_sources(SOURCE_COUNT, args.seed)
    return (
        model_dir,
        sources,
        (
            f"g2p: bi-GRU 256, Bahdanau/additive, beam 5, {args.g2p_steps} training steps; "
            f"CMUdict test words; references {reference_length:.2f} phonemes on average"
        ),
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(model_dir: Path, max_batch_size: int, args: argparse.Namespace):
    port = free_port()
    command = [
        sys.executable, "-m", "serving",
        "--model-dir", str(model_dir), "--model-name", MODEL, "--port", str(port),
        "--max-batch-size", str(max_batch_size), "--max-delay-ms", str(args.max_delay_ms),
        "--device", args.device, "--log-level", "warning",
    ]  # fmt: skip
    if args.intra_op_threads is not None:
        command += ["--intra-op-threads", str(args.intra_op_threads)]
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
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
# The load generator


async def drive(
    url: str,
    sources: list[str],
    expected: dict[str, str],
    concurrency: int,
    duration: float,
    warmup: float,
    model: str,
    mode: str,
) -> LevelResult:
    """``concurrency`` clients, each sending one-item requests back to back."""
    infer_url = f"{url}/v2/models/{MODEL}/infer"
    latencies: list[float] = []
    errors = mismatches = 0
    measure_from = time.monotonic() + warmup
    stop_at = measure_from + duration

    async def client(index: int, transport: httpx.AsyncHTTPTransport) -> None:
        nonlocal errors, mismatches
        i = index
        while (now := time.monotonic()) < stop_at:
            source = sources[i % len(sources)]
            i += concurrency
            tensor = {"name": "source", "shape": [1], "datatype": "BYTES", "data": [source]}
            body = json.dumps({"inputs": [tensor]}).encode()
            request = httpx.Request("POST", infer_url, content=body, headers=JSON_HEADERS)
            try:
                response = await transport.handle_async_request(request)
                content = await response.aread()
                ok = response.status_code == 200
                answer = json.loads(content)["outputs"][0]["data"][0] if ok else None
            except httpx.HTTPError:
                ok, answer = False, None
            done = time.monotonic()
            if now < measure_from:
                continue
            if not ok:
                errors += 1
            elif answer != expected[source]:
                mismatches += 1
            latencies.append(done - now)

    # One connection per simulated user, through httpx's transport layer: the client and the
    # server share the cores, and httpx.AsyncClient's per-request work (URL merging, cookies,
    # auth, hooks) cost 1.07 ms of CPU per request here against 0.68 ms for the transport alone,
    # CPU the server under test would otherwise have had. (A single AsyncClient shared by 64
    # tasks costs several ms per request in its pool.)
    ssl_context = ssl.create_default_context()  # made once: one per transport costs ~10 ms each
    transports = [httpx.AsyncHTTPTransport(verify=ssl_context) for _ in range(concurrency)]
    try:
        await asyncio.gather(*(client(i, t) for i, t in enumerate(transports)))
    finally:
        for transport in transports:
            await transport.aclose()
    seconds = time.monotonic() - measure_from
    lat_ms = np.array(latencies) * 1000
    return LevelResult(
        model=model,
        mode=mode,
        concurrency=concurrency,
        requests=len(latencies),
        errors=errors,
        mismatches=mismatches,
        seconds=round(seconds, 3),
        throughput=round(len(latencies) / seconds, 1),
        p50_ms=round(float(np.percentile(lat_ms, 50)), 2) if len(lat_ms) else float("nan"),
        p99_ms=round(float(np.percentile(lat_ms, 99)), 2) if len(lat_ms) else float("nan"),
    )


HEADER = (
    f"{'model':<10}{'mode':<10}{'conc':>6}{'requests':>10}{'errors':>8}{'wrong':>7}"
    f"{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'server cpu ms/req':>19}{'client cpu ms/req':>19}"
)


def print_table(results: list[LevelResult]) -> None:
    print(HEADER)
    for r in results:
        print(
            f"{r.model:<10}{r.mode:<10}{r.concurrency:>6}{r.requests:>10}{r.errors:>8}"
            f"{r.mismatches:>7}{r.throughput:>10.1f}{r.p50_ms:>9.2f}{r.p99_ms:>9.2f}"
            f"{r.server_cpu_ms:>19.3f}{r.client_cpu_ms:>19.3f}",
            flush=True,
        )


def bench_model(
    name: str, model_dir: Path, sources: list[str], args: argparse.Namespace
) -> list[LevelResult]:
    """Both servers (batched, then unbatched) at every concurrency, for one model."""
    expected = expected_predictions(model_dir, sources, args.device)
    print(
        f"# {name}: answers {mean_output_length(expected, model_dir):.2f} output tokens on average",
        flush=True,
    )
    results = []
    for mode, batch_size in (("batched", args.max_batch_size), ("unbatched", 1)):
        with running_server(model_dir, batch_size, args) as (url, pid):
            for concurrency in args.concurrency:
                cpu_before, client_before = cpu_seconds(pid), time.process_time()
                level = drive(
                    url, sources, expected, concurrency, args.duration, args.warmup, name, mode
                )
                with asyncio.Runner(loop_factory=CLIENT_LOOP) as runner:
                    result = runner.run(level)
                # warm-up included in both: upper bounds
                cpu = cpu_seconds(pid) - cpu_before
                client_cpu = time.process_time() - client_before
                result.server_cpu_ms = round(1000 * cpu / max(result.requests, 1), 3)
                result.client_cpu_ms = round(1000 * client_cpu / max(result.requests, 1), 3)
                results.append(result)
                print_table([result])
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    names = ["dir"] if args.model_dir else args.models
    results, descriptions = [], []
    with tempfile.TemporaryDirectory() as scratch:
        prepared = [(name, *prepare(name, Path(scratch), args)) for name in names]
        for name, model_dir, sources, description in prepared:
            descriptions.append(f"# {name}: {description}")
            print(descriptions[-1], flush=True)
            results += bench_model(name, model_dir, sources, args)
    print(
        f"\ndevice: {args.device}  cores: {os.cpu_count()}  max_batch_size: "
        f"{args.max_batch_size}  max_delay_ms: {args.max_delay_ms}  {args.duration:g} s per level"
        f"  client loop: {'uvloop' if uvloop is not None else 'asyncio'}"
    )
    print("\n".join(descriptions) + "\n")
    print_table(results)
    print()
    by_key = {(r.model, r.mode, r.concurrency): r for r in results}
    for name in names:
        for concurrency in args.concurrency:
            batched = by_key[name, "batched", concurrency]
            unbatched = by_key[name, "unbatched", concurrency]
            ratio = batched.throughput / unbatched.throughput if unbatched.throughput else math.inf
            print(
                f"{name:<10} concurrency {concurrency:>3}: batched / unbatched throughput = "
                f"{ratio:.2f}x"
            )
    failures = sum(r.errors + r.mismatches for r in results)
    print(f"errors + mismatched answers: {failures}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
