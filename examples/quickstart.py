"""Quickstart: fit, predict, score and read the attention of a Seq2Seq on digit reversal.

python examples/quickstart.py            # about a minute on 2 CPU cores
python examples/quickstart.py --quick    # a smoke run in seconds
"""

from __future__ import annotations

import argparse

import numpy as np

from skattn import Seq2Seq
from skattn.datasets import make_reversal


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model: a smoke run")
    args = parser.parse_args(argv)

    X, y = make_reversal(300 if args.quick else 3000, 3, 10, random_state=0)  # "3141" -> "1413"
    X_test, y_test = make_reversal(200, 3, 10, random_state=1)
    model = Seq2Seq(
        decoder="bahdanau",
        scorer="additive",
        hidden_size=32 if args.quick else 128,
        max_epochs=2 if args.quick else 20,
        random_state=0,
        verbose=True,
    )
    model.fit(X, y)
    print(f"\ntrained {model.n_iter_} epochs; last epoch: {model.history_[-1]}")
    print("predict:", dict(zip(X_test[:3], model.predict(X_test[:3]), strict=True)))
    print(f"exact match on 200 new strings: {model.score(X_test, y_test):.3f}")

    source = X_test[0]
    (weights,) = model.predict_attention([source])
    (prediction,) = model.predict([source])
    print(f"\nattention of {source!r} -> {prediction!r}: one row per output token, one column")
    print("per source token and the end-of-source marker </s>; each row sums to 1")
    print("      " + " ".join(f"{t:>5}" for t in [*source, "</s>"]))
    for token, row in zip(prediction, weights, strict=True):
        print(f"{token:>5} " + " ".join(f"{w:5.2f}" for w in row))
    assert np.allclose(weights.sum(axis=1), 1.0)


if __name__ == "__main__":
    main()
