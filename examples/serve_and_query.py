"""Export a model, serve it with ``python -m serving``, query it two ways, and stop it.

1. Train a digit-reversal model (or take an exported artifact with ``--model-dir``) and export
   it: ``Seq2Seq.export_onnx(dir)`` writes ``encoder.onnx``, ``decoder_step.onnx``,
   ``decode.onnx`` (the whole search in one graph) and ``manifest.json``.
2. Start the server in a subprocess on a free loopback port and wait for ``/v2/health/ready``.
3. Query it over the Open Inference Protocol (KServe v2) with Triton's own client
   (``tritonclient.http``, binary tensors) and with plain HTTP/JSON (``httpx``); both answers
   are checked against ``serving.load`` run in this process (and against the estimator).
4. Print the predictions and one attention map, then stop the server with SIGTERM.

    python examples/serve_and_query.py                 # train for a minute or two, then serve
    python examples/serve_and_query.py --quick         # a smoke run in seconds
    python examples/serve_and_query.py --model-dir g2p_model --sources PYTHON ATTENTION
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

import serving
from skattn.argtypes import artifact_directory
from skattn.artifact_writer import check_export_directory
from skattn.core.inference import as_text
from skattn.core.text import tokenize

MODEL_NAME = "model"
REVERSAL_SOURCES = ["31415926", "2718", "123456789", "7"]
OUTPUTS = ("prediction", "attention", "attention_lengths")


def train_reversal(steps: int, hidden_size: int):
    """A Bahdanau-attention digit-reversal model trained for ``steps`` Adam steps."""
    from skattn import Seq2Seq
    from skattn.datasets import make_reversal

    X, y = make_reversal(64 * steps, min_length=1, max_length=10, random_state=0)
    model = Seq2Seq(
        hidden_size=hidden_size,
        embedding_dim=32,
        batch_size=64,
        max_steps=steps,
        early_stopping=False,
        random_state=0,
        verbose=True,
    )
    return model.fit(X, y)


def free_port() -> int:
    """A TCP port that is free on loopback now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(model_dir: Path, port: int, timeout: float = 60.0):
    """``python -m serving`` in a subprocess, ready when entered, stopped by SIGTERM on exit."""
    command = [
        sys.executable, "-m", "serving", "--model-dir", str(model_dir),
        "--model-name", MODEL_NAME, "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    server = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + timeout
        while not _ready(f"http://127.0.0.1:{port}"):
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with code {server.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not ready after {timeout:.0f} s")
            time.sleep(0.2)
        yield server
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        print(f"\nserver stopped with SIGTERM: exit code {server.returncode}")


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/v2/health/ready", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def query_tritonclient(port: int, sources: list[str]) -> tuple[list[str], list[np.ndarray]]:
    """Infer through ``tritonclient.http``: BYTES in, predictions and attention maps out."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url=f"127.0.0.1:{port}")
    try:
        if not (client.is_server_live() and client.is_model_ready(MODEL_NAME)):
            raise RuntimeError("the server says it is not live or the model is not ready")
        metadata = client.get_model_metadata(MODEL_NAME)
        print(
            f"model metadata: inputs {[i['name'] for i in metadata['inputs']]}, "
            f"outputs {[o['name'] for o in metadata['outputs']]}"
        )
        source = triton.InferInput("source", [len(sources)], "BYTES")
        source.set_data_from_numpy(np.array([s.encode() for s in sources], dtype=object))
        requested = [triton.InferRequestedOutput(name, binary_data=True) for name in OUTPUTS]
        result = client.infer(MODEL_NAME, [source], outputs=requested)
    finally:
        client.close()
    predictions = [p.decode() for p in result.as_numpy("prediction")]
    return predictions, _unpad(result.as_numpy("attention"), result.as_numpy("attention_lengths"))


def query_httpx(port: int, sources: list[str]) -> tuple[list[str], list[np.ndarray]]:
    """Infer with a plain JSON request: what any HTTP client can send."""
    request = {
        "inputs": [
            {"name": "source", "shape": [len(sources)], "datatype": "BYTES", "data": sources}
        ],
        "outputs": [{"name": name} for name in OUTPUTS],
    }
    url = f"http://127.0.0.1:{port}/v2/models/{MODEL_NAME}/infer"
    reply = httpx.post(url, json=request, timeout=60.0)
    reply.raise_for_status()
    outputs = {o["name"]: o for o in reply.json()["outputs"]}
    attention = np.asarray(outputs["attention"]["data"], dtype=np.float32)
    attention = attention.reshape(outputs["attention"]["shape"])  # (N, max T_y, max T_x)
    lengths = np.asarray(outputs["attention_lengths"]["data"]).reshape(-1, 2)  # (N, 2)
    return outputs["prediction"]["data"], _unpad(attention, lengths)


def _unpad(attention: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """The padded ``(N, T_y, T_x)`` batch back into N maps of their own shapes."""
    return [a[:t_y, :t_x] for a, (t_y, t_x) in zip(attention, lengths, strict=True)]


def print_attention(source: str, prediction: str, weights: np.ndarray, info) -> None:
    """One map as text: a row per output token, a column per source token and the end marker."""
    columns = tokenize(source, info.tokenizer) + ["</s>"]
    # the server sends token outputs joined by spaces, string outputs as they are
    rows = tokenize(prediction, "space" if info.output_kind == "tokens" else info.tokenizer)
    print(f"\nattention map of {source!r} -> {prediction!r}:")
    print("      " + "".join(f"{c:>6}" for c in columns))
    for token, row in zip(rows, weights, strict=True):
        print(f"{token:>6}" + "".join(f"{w:6.2f}" for w in row))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model: a smoke run")
    parser.add_argument(
        "--model-dir", type=artifact_directory, help="serve this exported artifact instead"
    )
    parser.add_argument("--sources", nargs="+", help="what to translate")
    parser.add_argument(
        "--out", type=Path, help="export into OUT/reversal (default: a temporary dir)"
    )
    args = parser.parse_args(argv)
    if args.model_dir is not None and not args.sources:
        parser.error("--model-dir needs --sources (what to send to that model)")
    if args.out is not None:
        try:
            check_export_directory(args.out / "reversal")
        except ValueError as error:
            parser.error(f"--out: {error}")

    with tempfile.TemporaryDirectory() as tmp:
        estimator = None
        model_dir = args.model_dir
        if model_dir is None:
            estimator = train_reversal(*((20, 32) if args.quick else (600, 128)))
            model_dir = (args.out or Path(tmp)) / "reversal"
            estimator.export_onnx(model_dir)
            print(f"exported to {model_dir}: {sorted(p.name for p in model_dir.iterdir())}")
        sources = args.sources or REVERSAL_SOURCES
        runtime = serving.load(model_dir, device="cpu")
        loaded = runtime.predict(sources)
        if estimator is not None and estimator.predict(sources) != loaded:
            raise RuntimeError("serving.load's predictions differ from the estimator's")
        expected = [as_text(p) for p in loaded]

        port = free_port()
        with running_server(model_dir, port):
            answers = {
                "tritonclient.http": query_tritonclient(port, sources),
                "httpx (JSON)": query_httpx(port, sources),
            }
            for client, (predictions, _) in answers.items():
                print(f"\n{client} -> POST /v2/models/{MODEL_NAME}/infer")
                for source, prediction, reference in zip(
                    sources, predictions, expected, strict=True
                ):
                    mark = "ok" if prediction == reference else f"MISMATCH ({reference!r})"
                    print(f"  {source!r:>18} -> {prediction!r:<24} {mark}")
                if predictions != expected:
                    raise RuntimeError(f"{client}: the server's predictions differ from load's")
            predictions, maps = answers["tritonclient.http"]
            print_attention(sources[0], predictions[0], maps[0], runtime.info)
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
            counts = [
                line
                for line in metrics.splitlines()
                if line.startswith("skattn_requests_total") and not line.endswith(" 0.0")
            ]
            print("\n" + "\n".join(counts))
    return {"sources": sources, "predictions": predictions, "attention": maps}


if __name__ == "__main__":
    main()
