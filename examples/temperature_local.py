"""Attention temperature and local attention, seen on digit reversal.

One digit-reversal model with Bahdanau's additive attention is trained once; at prediction time
its attention softmax is read at three temperatures,

    alpha_ij = exp(e_ij / tau) / sum_k exp(e_ik / tau),    tau in {0.1, 1, 10},

(``Seq2Seq.set_params(temperature=tau)`` after ``fit``): a low tau sharpens each row towards its
argmax, a high tau flattens it towards uniform, and the contexts, hence the predictions, follow.
A second model uses Luong's local-p attention: each step predicts a centre
``p_i = S * sigmoid(v_p . tanh(s_i W_p))`` and attends only to ``|j - p_i| <= D``, weighted by a
Gaussian of ``sigma = D / 2``. The four alignment matrices of one input go into one PNG, and a
table gives each setting's exact match and mean row entropy on held-out strings.

    python examples/temperature_local.py            # 400 steps each: docs/temperature_local.png
    python examples/temperature_local.py --quick    # a smoke run in seconds, into a temp folder
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from skattn import Seq2Seq
from skattn.datasets import make_reversal
from skattn.metrics import exact_match

TEMPERATURES = (0.1, 1.0, 10.0)
SOURCE = "31415926"
#: Half-width D of the local-p window (the source has 8 digits plus the end marker).
WINDOW = 2


def train(params: dict, steps: int, hidden_size: int, random_state: int = 0) -> Seq2Seq:
    """A reversal model trained for ``steps`` Adam steps on digit strings of length 1 to 10."""
    X, y = make_reversal(64 * steps, min_length=1, max_length=10, random_state=random_state)
    model = Seq2Seq(
        **params,
        hidden_size=hidden_size,
        embedding_dim=32,
        batch_size=64,
        max_steps=steps,
        early_stopping=False,
        random_state=random_state,
        verbose=True,
    )
    return model.fit(X, y)


def mean_row_entropy(maps: list[np.ndarray]) -> float:
    """Mean over all rows of ``H(alpha_i) = -sum_j alpha_ij log alpha_ij``, in nats."""
    entropies = [-(row[row > 0] * np.log(row[row > 0])).sum() for m in maps for row in m]
    return float(np.mean(entropies)) if entropies else float("nan")


def measure(model: Seq2Seq, label: str, X_test: list[str], y_test: list[str]) -> dict:
    """Exact match, mean attention entropy and the alignment of ``SOURCE`` at the model's tau."""
    maps = model.predict_attention(X_test)
    (prediction,) = model.predict([SOURCE])
    (weights,) = model.predict_attention([SOURCE])
    return {
        "label": label,
        "exact_match": exact_match(y_test, model.predict(X_test)),
        "entropy": mean_row_entropy(maps),
        "prediction": prediction,
        "weights": weights,
    }


def format_table(rows: list[dict]) -> str:
    """The measurements as a Markdown table."""
    lines = [
        "| attention | exact match | mean row entropy (nats) |",
        "|---|---:|---:|",
    ]
    lines += [f"| {r['label']} | {r['exact_match']:.3f} | {r['entropy']:.3f} |" for r in rows]
    return "\n".join(lines)


def save_figure(rows: list[dict], path: Path) -> None:
    """One PNG: the alignment matrix of ``SOURCE`` for every row, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from skattn.plotting import plot_attention

    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 4.4))
    for ax, row in zip(np.atleast_1d(axes), rows, strict=True):
        plot_attention(row["weights"], list(SOURCE) + ["</s>"], list(row["prediction"]), ax=ax)
        ax.set_title(f"{row['label']}\n{SOURCE} -> {row['prediction']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps: a smoke run")
    parser.add_argument("--steps", type=int, default=400, help="training steps per model")
    parser.add_argument(
        "--out",
        type=Path,
        help="where the PNG goes (default: docs/, or a fresh temporary folder with --quick)",
    )
    args = parser.parse_args(argv)
    if args.out is None:  # a smoke run must not overwrite the README's figure
        args.out = (
            Path(tempfile.mkdtemp(prefix="skattn-temperature-")) if args.quick else Path("docs")
        )
    steps, hidden_size, n_test = (20, 32, 50) if args.quick else (args.steps, 128, 500)
    if steps < 1:
        parser.error("--steps must be >= 1")
    X_test, y_test = make_reversal(n_test, 8, 8, random_state=1)

    start = time.perf_counter()
    model = train({"decoder": "bahdanau", "scorer": "additive"}, steps, hidden_size)
    rows = []
    for tau in TEMPERATURES:
        model.set_params(temperature=tau)  # a prediction-time setting: no refit
        rows.append(measure(model, f"additive, tau = {tau:g}", X_test, y_test))
    local = train(
        {"decoder": "luong", "scorer": "general", "attention": "local-p", "window": WINDOW},
        steps,
        hidden_size,
    )
    rows.append(measure(local, f"local-p, D = {WINDOW}, tau = 1", X_test, y_test))
    seconds = time.perf_counter() - start

    print(f"\nDigit reversal, {steps} steps per model, {n_test} held-out strings of length 8:\n")
    print(format_table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "temperature_local.png"
    save_figure(rows, path)
    print(f"\nalignment matrices of {SOURCE!r}: {path}  ({seconds:.0f} s)")
    return rows


if __name__ == "__main__":
    main()
