"""skattn end to end: the seeds' math, a trained model, its ONNX export and the server.

1. The seeds' worked examples through ``skattn.reference`` (the test oracle).
2. The seeds' experiment: digit reversal with and without attention (``reversal_attention.py``).
3. The attention model exported to ONNX and served by ``python -m serving`` on loopback.
4. Queried over the Open Inference Protocol (KServe v2), checked against the estimator, and shut
   down with SIGTERM. The same server serves the English G2P model that ships in the package
   (``--model cmudict-g2p``), asked for test words it never saw, beside their CMUdict entries.

    python examples/demo.py            # the full demo (a few minutes on 2 CPU cores)
    python examples/demo.py --quick    # a smoke run (its PNG goes to a temporary folder)
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from reversal_attention import format_table, run_experiment, save_heatmap

import serving
from skattn import argtypes, reference
from skattn.datasets import group_pronunciations, load_cmudict

G2P = "cmudict-g2p"


def seeds_worked_examples() -> None:
    """Print the two worked examples of the seed chapters, computed by the reference."""
    s = np.array([[1.0, 0.0]])
    H = np.array([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])
    eye = np.eye(2)
    context, weights = reference.additive_attention(s, H, eye, eye, np.ones(2))
    print(
        "additive attention (seed 000):  weights",
        np.round(weights[0], 3),
        " context",
        np.round(context[0], 3),
    )
    s = np.array([[2.0, 0.0]])
    H = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    weights = reference.masked_softmax(reference.luong_scores(s, H, "dot"))
    context = np.einsum("bt,btd->bd", weights, H)
    print(
        "dot attention      (seed 001):  weights",
        np.round(weights[0], 3),
        " context",
        np.round(context[0], 3),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: Test words of CMUdict's standard split (never trained on) for the packaged G2P model.
G2P_WORDS = ["PARAPHRASE", "BIBLIOGRAPHY", "PTOLEMY", "REFRIGERATORS", "MASSACRE", "EIGHTIES"]


def serve_and_query(model, model_dir: Path, sources: list[str]) -> None:
    """Start the server on ``model_dir`` (and the packaged G2P model), query it, compare with
    ``model``, stop it."""
    port = free_port()
    g2p = G2P in serving.packaged_models()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving",
            "--model-dir",
            str(model_dir),
            "--model-name",
            "reversal",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *(["--model", G2P] if g2p else []),
        ],
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not become ready")
            time.sleep(0.2)
        request = {
            "inputs": [
                {"name": "source", "shape": [len(sources)], "datatype": "BYTES", "data": sources}
            ],
            "outputs": [
                {"name": "prediction"},
                {"name": "attention"},
                {"name": "attention_lengths"},
            ],
        }
        reply = httpx.post(f"{base}/v2/models/reversal/infer", json=request, timeout=30)
        reply.raise_for_status()
        outputs = {o["name"]: o for o in reply.json()["outputs"]}
        served = outputs["prediction"]["data"]
        local = model.predict(sources)
        print(f"\nPOST {base}/v2/models/reversal/infer")
        print(f"  {'source':>16}    {'served':<16} {'reversed?':<10} same as the estimator?")
        for source, prediction, expected in zip(sources, served, local, strict=True):
            right = "right" if prediction == source[::-1] else "WRONG"
            same = "same" if prediction == expected else f"MISMATCH (estimator: {expected!r})"
            print(f"  {source!r:>16} -> {prediction!r:<16} {right:<10} {same}")
        if served != local:
            raise RuntimeError("the server's predictions differ from the estimator's")
        t_y, t_x = outputs["attention_lengths"]["data"][:2]
        shape = outputs["attention"]["shape"]
        first = np.asarray(outputs["attention"]["data"], dtype=np.float32).reshape(shape)[0]
        print(
            f"\nattention map of {sources[0]!r} ({t_y} output rows x {t_x} source columns,"
            " the last column is the end-of-source marker):"
        )
        print(np.array2string(first[:t_y, :t_x], precision=2, suppress_small=True))
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
        served_lines = [
            line for line in metrics.splitlines() if line.startswith("skattn_requests_total")
        ]
        print("\n" + "\n".join(served_lines))
        if g2p:
            query_g2p(base)
        else:
            print(f"\n(no packaged {G2P} model in this install)")
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        print(f"\nserver stopped with SIGTERM, exit code {code}")


def query_g2p(base: str) -> None:
    """Ask the packaged G2P model for ``G2P_WORDS`` and set its answers beside CMUdict's."""
    words, pronunciations = group_pronunciations(*load_cmudict("test"))
    references = {w: [" ".join(p) for p in ps] for w, ps in zip(words, pronunciations, strict=True)}
    request = {
        "inputs": [
            {"name": "source", "shape": [len(G2P_WORDS)], "datatype": "BYTES", "data": G2P_WORDS}
        ]
    }
    reply = httpx.post(f"{base}/v2/models/{G2P}/infer", json=request, timeout=60)
    reply.raise_for_status()
    served = reply.json()["outputs"][0]["data"]
    print(f"\nPOST {base}/v2/models/{G2P}/infer (the packaged English G2P model, test words)")
    for word, phonemes in zip(G2P_WORDS, served, strict=True):
        known = references.get(word, [])
        verdict = "right" if phonemes in known else f"CMUdict: {' / '.join(known) or '-'}"
        print(f"  {word:<12} -> {phonemes:<28} {verdict}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run in seconds")
    parser.add_argument(
        "--out",
        type=Path,
        help="where PNGs go (default: docs/, or a fresh temporary folder with --quick)",
    )
    parser.add_argument(
        "--threads",
        type=argtypes.threads,
        default=1,
        help="torch threads (default 1: these small models lose little, and more threads spin "
        "against any other busy process, over 10x slower)",
    )
    args = parser.parse_args(argv)
    if args.out is None:  # a smoke run must not overwrite the README's figure
        args.out = Path(tempfile.mkdtemp(prefix="skattn-demo-")) if args.quick else Path("docs")

    print("== 1. the seeds' worked examples ==")
    seeds_worked_examples()

    steps = 20 if args.quick else 250
    print(f"\n== 2. digit reversal, {steps} training steps, with and without attention ==")
    rows, models = run_experiment(
        steps, n_eval=100 if args.quick else 500, verbose=True, n_threads=args.threads
    )
    print()
    print(format_table(rows))
    model = models["bahdanau attention"]
    args.out.mkdir(parents=True, exist_ok=True)
    save_heatmap(model, args.out / "reversal_attention.png")
    print(f"alignment heatmap: {args.out / 'reversal_attention.png'}")

    print("\n== 3. export to ONNX and serve ==")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "reversal"
        model.export_onnx(model_dir)
        print(f"exported: {sorted(os.listdir(model_dir))}")
        serve_and_query(model, model_dir, ["31415926", "2718", "123456789012", "7"])


if __name__ == "__main__":
    main()
