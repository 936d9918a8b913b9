"""Do the defaults learn fast? The seeds' experiment, over several random states.

A bi-GRU of 128 units with Bahdanau attention, batch 64, 250 steps on digit strings of lengths
1-12, every other hyperparameter at the estimator's default (issue: "defaults that learn fast"),
then the greedy exact match on 500 new strings of length 8 and 12. Candidate overrides of the
defaults are run side by side, round-robin over the random states, so that a change of the
machine's speed falls on all of them alike.

    python benchmarks/bench_defaults.py                         # the defaults, 5 random states
    python benchmarks/bench_defaults.py --candidate lr=1e-2 ... # KEY=VALUE overrides to compare
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time

import machine

from skattn import Seq2Seq
from skattn.datasets import make_reversal
from skattn.metrics import exact_match

STEPS = 250
EXPERIMENT = dict(hidden_size=128, batch_size=64, max_steps=STEPS, decoder="bahdanau")


def parse_candidate(text: str) -> dict:
    """``"learning_rate=1e-2,lr_schedule='cosine'"`` -> a dict of parameters."""
    if text == "defaults":
        return {}
    params = {}
    for part in text.split(","):
        key, value = part.split("=", 1)
        try:
            params[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            params[key] = value
    return params


def run(params: dict, random_state: int, examples: int = 64 * STEPS) -> tuple[float, float, float]:
    """Exact match at length 8 and 12, and the training seconds, of one fit of the experiment
    with ``params`` overriding it, on ``examples`` fresh strings."""
    X, y = make_reversal(examples, min_length=1, max_length=12, random_state=random_state)
    model = Seq2Seq(**(EXPERIMENT | params), device="cpu", random_state=random_state)
    start = time.perf_counter()
    model.fit(X, y)
    seconds = time.perf_counter() - start
    scores = []
    for length in (8, 12):
        X_test, y_test = make_reversal(500, length, length, random_state=1000 + length)
        scores.append(exact_match(y_test, model.predict(X_test)))
    return scores[0], scores[1], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidate", nargs="+", default=["defaults"])
    parser.add_argument("--random-states", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    machine.use_threads(args.threads)
    results: dict[str, list] = {c: [] for c in args.candidate}
    for random_state in args.random_states:
        for candidate in args.candidate:
            em8, em12, seconds = run(parse_candidate(candidate), random_state)
            results[candidate].append((em8, em12, seconds))
            print(
                f"{candidate:<48} rs={random_state}  EM@8 {em8:.3f}  EM@12 {em12:.3f}  "
                f"{seconds:.1f} s",
                flush=True,
            )
    print("\n| candidate | EM@8 per random state | min EM@8 | mean EM@12 | s per fit |")
    print("|---|---|---:|---:|---:|")
    for candidate, rows in results.items():
        em8 = [r[0] for r in rows]
        print(
            f"| {candidate} | {' '.join(f'{e:.2f}' for e in em8)} | {min(em8):.3f} | "
            f"{statistics.mean(r[1] for r in rows):.3f} | "
            f"{statistics.mean(r[2] for r in rows):.1f} |"
        )


if __name__ == "__main__":
    main()
