"""Model selection with scikit-learn: GridSearchCV over scorer x decoder x input feeding.

``Seq2Seq`` is an ordinary scikit-learn estimator, so ``GridSearchCV`` clones it, fits each
configuration on every fold (in parallel with ``n_jobs``) and ranks them by a sequence metric
from ``skattn.scoring.SCORERS``. Input feeding belongs to Luong's decoder only, so the grid is a
list of two grids and no configuration is trained twice under two names. The task is digit
reversal (``--task reversal``) or numbers written in words (``--task number-words``,
``"42" -> "forty-two"``).

    python examples/grid_search.py                      # 12 configurations x 3 folds
    python examples/grid_search.py --task number-words  # the same grid on number words
    python examples/grid_search.py --quick              # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.model_selection import GridSearchCV, KFold

from skattn import Seq2Seq
from skattn.datasets import make_number_words, make_reversal
from skattn.scoring import SCORERS

SCORER_NAMES = ["dot", "general", "additive", "scaled_dot"]
PARAM_GRID = [
    {"decoder": ["bahdanau"], "scorer": SCORER_NAMES},
    {"decoder": ["luong"], "scorer": SCORER_NAMES, "input_feeding": [True, False]},
]
QUICK_GRID = [
    {"decoder": ["bahdanau"], "scorer": ["dot"]},
    {"decoder": ["luong"], "scorer": ["dot"], "input_feeding": [True, False]},
]


def make_task(task: str, n_samples: int, random_state: int) -> tuple[list[str], list[str]]:
    """The training pairs of ``task``: ``"reversal"`` or ``"number-words"``."""
    if task == "reversal":
        return make_reversal(n_samples, 1, 10, random_state=random_state)
    return make_number_words(n_samples, 0, 9999, random_state=random_state)


def results_table(cv_results: dict) -> str:
    """``cv_results_`` as a Markdown table, best mean test score first."""
    order = np.argsort(cv_results["rank_test_score"], kind="stable")
    lines = [
        "| rank | decoder | scorer | input feeding | mean test score | std | mean fit (s) |",
        "|---:|---|---|---|---:|---:|---:|",
    ]
    for i in order:
        params = cv_results["params"][i]
        feeding = params.get("input_feeding", "-") if params["decoder"] == "luong" else "-"
        lines.append(
            f"| {cv_results['rank_test_score'][i]} | {params['decoder']} | {params['scorer']} "
            f"| {feeding} | {cv_results['mean_test_score'][i]:.3f} "
            f"| {cv_results['std_test_score'][i]:.3f} | {cv_results['mean_fit_time'][i]:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> GridSearchCV:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny grid: a smoke run")
    parser.add_argument("--task", choices=["reversal", "number-words"], default="reversal")
    parser.add_argument("--scoring", choices=sorted(SCORERS), default="token_accuracy")
    parser.add_argument("--steps", type=int, default=150, help="training steps per fit")
    parser.add_argument("--cv", type=int, default=3, help="folds")
    parser.add_argument("--n-jobs", type=int, default=2, help="fits run in parallel")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.cv, args.n_jobs = 5, 2, 1
    if args.steps < 1 or args.cv < 2 or args.n_jobs < 1:
        parser.error("--steps and --n-jobs must be >= 1 and --cv >= 2")

    batch_size = 32
    n_samples = batch_size * args.steps * args.cv // (args.cv - 1)  # one pass per training fold
    X, y = make_task(args.task, n_samples, random_state=0)
    model = Seq2Seq(
        hidden_size=16 if args.quick else 64,
        embedding_dim=16 if args.quick else 32,
        batch_size=batch_size,
        max_steps=args.steps,
        early_stopping=False,
        random_state=0,
    )
    search = GridSearchCV(
        model,
        QUICK_GRID if args.quick else PARAM_GRID,
        scoring=SCORERS[args.scoring],
        cv=KFold(args.cv, shuffle=True, random_state=0),
        n_jobs=args.n_jobs,
        refit=False,
    )
    start = time.perf_counter()
    search.fit(X, y)
    seconds = time.perf_counter() - start
    n_configs = len(search.cv_results_["params"])
    print(
        f"\n{args.task}: {n_configs} configurations x {args.cv} folds, {args.steps} steps "
        f"each, {len(X)} pairs, scoring={args.scoring} ({seconds:.0f} s):\n"
    )
    print(results_table(search.cv_results_))
    print(f"\nbest: {search.best_params_} ({search.best_score_:.3f})")
    return search


if __name__ == "__main__":
    main()
