"""Package the English G2P models that ship in ``serving/models/cmudict-g2p*``.

Takes the saved models of ``examples/g2p_cmudict.py --save`` (one, or the members of an
ensemble) and the results JSON of the run that evaluated them (``--out``, from the same
command with ``--ensemble`` for an ensemble), exports them as one artifact, and writes beside
it what a user needs to trust it: ``RECIPE.md`` (how it was trained and chosen), ``figures.json``
(its measured dev and test figures) and ``LICENSE`` (CMUdict's, whose words it learned from)::

    python scripts/package_g2p.py --model runs/g2p/member0.joblib runs/g2p/member1.joblib \\
        --results runs/g2p/ensemble.json --out serving/models/cmudict-g2p

The artifact searches with the beam its figures were measured at (the results' ``beam_size``).

With ``--quantize int8`` the artifact's weight products are int8 (``export_onnx(quantize=
"int8")``, for onnxruntime on the CPU: ``serving/models/cmudict-g2p-int8``); with
``--quantize float16`` its weights are stored in float16 and computed in float32 (half the
bytes, any device: ``serving/models/cmudict-g2p``). Either way its figures are measured here on
the artifact itself (test and dev words, through ``serving.load``).

A model trained on CMUdict's stress (``examples/g2p_cmudict.py --stress``, which the results
record) is packaged as one that gives stress (``serving/models/cmudict-g2p-stress-int8``): its
``RECIPE.md`` says so and its figures are given both ways, with the stress taken off against
the split's references and with it against CMUdict's stressed pronunciations::

    python examples/g2p_cmudict.py --stress --num-layers 2 --threads 2 --max-minutes 95 \
        --model-seed 0 --save runs/stress.joblib --out runs/stress.json
    python scripts/package_g2p.py --model runs/stress.joblib --results runs/stress.json \
        --quantize int8 --out serving/models/cmudict-g2p-stress-int8

The package budget is about 15 MB (``--max-mb``). An artifact holds each member's weights in
its step graphs and again in ``decode.onnx``; when the whole is over the budget,
``decode.onnx`` (optional in an artifact: the runtime then decodes over the step graphs, with
the same results) is left out, and ``RECIPE.md`` says so.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

from skattn import Seq2Seq, Seq2SeqEnsemble
from skattn.argtypes import load_saved
from skattn.core.manifest import DECODE_FILE, MANIFEST_FILE, Manifest

REPO = Path(__file__).resolve().parents[1]
DATA_README = REPO / "skattn" / "data" / "README.md"


def cmudict_license() -> str:
    """The CMUdict section of the packaged data's README: source, copyright and license."""
    text = DATA_README.read_text(encoding="utf-8")
    start = text.index("Source: the Carnegie Mellon University Pronouncing Dictionary")
    return (
        "The model in this folder was trained on the CMU Pronouncing Dictionary (CMUdict) 0.7b,\n"
        "standard G2P training split. Its license:\n\n" + text[start:].strip() + "\n"
    )


#: What RECIPE.md says of a quantized export.
QUANTIZED = {
    "int8": 'Exported with `quantize="int8"`: the weight products in int8 '
    "(`skattn.quantize`, each product's input range measured once at export), for "
    "onnxruntime on the CPU only. Its answers are close to the float32 model's, not "
    "equal to them, and never depend on the words batched beside them; the figures "
    "below are this artifact's own.",
    "float16": 'Exported with `quantize="float16"`: the weights stored in float16 and cast '
    "to float32 as onnxruntime opens the graphs (`skattn.float16_weights`), so the model "
    "takes half the bytes and computes in float32, on the CPU or CUDA. Each weight is "
    "rounded to float16, so its answers are close to the float32 model's, not always "
    "equal to them; the figures below are this artifact's own.",
}


def directory_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.iterdir()) / 2**20


def drop_decode_graph(directory: Path) -> None:
    """Remove ``decode.onnx`` and rewrite the manifest's checksums without it."""
    (directory / DECODE_FILE).unlink()
    manifest = Manifest.from_json((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
    (directory / MANIFEST_FILE).write_text(manifest.with_files(directory).to_json())


def error_figures(test: dict, dev: dict) -> dict:
    """PER and WER of an evaluation's test and dev rows (``g2p_cmudict.evaluate``), rounded;
    a stressed model's figures with the stress too (its rows' ``"stressed"``)."""
    record = {}
    for split, row in (("test", test), ("dev", dev)):
        record |= {f"{split}_per": round(row["per"], 2), f"{split}_wer": round(row["wer"], 2)}
    for split, row in (("test", test), ("dev", dev)):
        if "stressed" in row:
            stressed = row["stressed"]
            record |= {
                f"stressed_{split}_per": round(stressed["per"], 2),
                f"stressed_{split}_wer": round(stressed["wer"], 2),
                f"stressed_{split}_words": stressed["words"],
            }
    return record


def figures(results: dict, members: list) -> dict:
    """What ``figures.json`` records: test and dev PER/WER (with stress too for a model trained
    on it), speeds, training time."""
    test, dev = results["skattn_test"], results["skattn_dev"]
    greedy = results.get("skattn_test_greedy", {})
    return {
        **error_figures(test, dev),
        "test_words": test["words"],
        "dev_words": dev["words"],
        "stress": bool(results["config"].get("stress")),
        "beam_size": results["config"]["beam_size"],
        "greedy_test_wer": round(greedy["wer"], 2) if greedy else None,
        # every epoch of every member, a continued run's earlier epochs too (warm_start)
        "train_seconds": round(sum(r["seconds"] for m in members for r in m.history_), 1),
        "members": len(members),
        "member_epochs": [m.n_iter_ for m in members],
    }


def measured_figures(record: dict, artifact: Path, dev_words: int, seed: int) -> dict:
    """``record`` with the test and dev PER / WER of ``artifact`` itself, as served (a
    quantized artifact's answers are close to the float model's, not always equal to them)."""
    import sys

    import serving

    sys.path.insert(0, str(REPO / "examples"))
    from g2p_cmudict import evaluate, load_splits

    splits = load_splits(dev_words, None, seed)
    runtime = serving.load(artifact, "cpu")
    measured = {split: evaluate(runtime.predict, *splits[split]) for split in ("test", "dev")}
    return record | {
        **error_figures(measured["test"], measured["dev"]),
        "greedy_test_wer": None,  # not measured: the artifact searches with its beam
        "quantization": runtime.manifest.quantization,
    }


def recipe(args: argparse.Namespace, models: list, record: dict, dropped: bool) -> str:
    member = models[0]
    config = member.get_params()
    layers = f" of {config['num_layers']} layers" if config["num_layers"] > 1 else ""
    states = sorted({str(m.get_params()["random_state"]) for m in models})
    seeds = (
        f"random state {states[0]} for each"
        if len(states) == 1 and len(models) > 1
        else f"random state{'s' if len(states) > 1 else ''} {', '.join(states)}"
    )
    minutes = (config["max_time"] or 0) / 60
    members = "\n".join(f"- `{p.name}`" for p in args.model)
    name = args.out.name
    stress = record["stress"]
    lines = [
        f"# {name}: English grapheme-to-phoneme (CMUdict ARPAbet, "
        + ("with stress)" if stress else "stress removed)"),
        "",
        f"Serve it: `python -m serving --model {name}`; in Python:",
        f'`serving.load(serving.packaged_model_dir("{name}")).predict(["HELLO"])`',
        "(words in upper case, as CMUdict spells them: lower-case letters are unknown to it, so",
        "upper-case a word first; one list of phonemes per word).",
        *(
            [
                "Each vowel carries CMUdict's stress, 0 (none), 1 (primary) or 2 (secondary):",
                '`["HH", "AH0", "L", "OW1"]`; `skattn.datasets.strip_stress` takes the digits off.',
            ]
            if stress
            else []
        ),
        "",
        "## How it was made",
        "",
        f"{record['members']} model(s) trained by `examples/g2p_cmudict.py` with "
        f"`--threads {member.n_threads_} --max-minutes {minutes:g}"
        + (
            " --stress` (CMUdict's stressed pronunciations of the training words)"
            if stress
            else "`"
        )
        + " and the settings the "
        f"saved members ended with ({config['decoder'].capitalize()} decoder, "
        f"{config['scorer']} attention, "
        f"{config['encoder']} encoder, bi-{config['cell'].upper()} "
        f"{config['hidden_size']}{layers}, embedding {config['embedding_dim']}, dropout "
        f"{config['dropout']}, batch {config['batch_size']}, Adam {config['learning_rate']} on a "
        f"{config['lr_schedule']} schedule, the epoch with the best validation "
        f"{config['early_stopping_metric'].replace('_', ' ')} kept; {seeds}, "
        f"`--model-seed`), on the training words left after a "
        f"{record['dev_words']:,}-word development set; chosen on it only.",
        members,
        *([f"\n{args.note}"] if args.note else []),
        "",
        "Combined as `skattn.Seq2SeqEnsemble.from_fitted(members, beam_size="
        f"{record['beam_size']})` (the mean of the members' log-probabilities at every step) "
        "and exported with `export_onnx`."
        if record["members"] > 1
        else "Exported with `export_onnx`.",
        *(["", QUANTIZED[args.quantize]] if args.quantize else []),
        "",
        f"Training: {record['train_seconds'] / 60:.1f} minutes in all (epochs per member: "
        f"{record['member_epochs']}), {member.n_threads_} CPU thread(s) each.",
        "",
        f"## Figures (CMUdict 0.7b standard test split, {record['test_words']:,} words)",
        "",
        f"- test: PER {record['test_per']} %, WER {record['test_wer']} % (beam "
        f"{record['beam_size']})"
        + (f"; greedy WER {record['greedy_test_wer']} %" if record["greedy_test_wer"] else ""),
        f"- development set: PER {record['dev_per']} %, WER {record['dev_wer']} %",
        *(
            [
                "",
                "Those are with the stress taken off, against the split's stressless references",
                "(the published figures' terms). With the stress, against CMUdict's stressed",
                "pronunciations of the words that have one:",
                "",
                f"- test ({record['stressed_test_words']:,} words): PER "
                f"{record['stressed_test_per']} %, WER {record['stressed_test_wer']} %",
                f"- development set ({record['stressed_dev_words']:,} words): PER "
                f"{record['stressed_dev_per']} %, WER {record['stressed_dev_wer']} %",
            ]
            if stress
            else []
        ),
        "",
        "WER is the share of words whose prediction matches none of their pronunciations; PER the",
        "edit distance to the closest one over the reference lengths.",
    ]
    if dropped:
        lines += [
            "",
            "`decode.onnx` (the whole search in one graph) is left out to keep the package near",
            "15 MB: the runtime and the server decode over `encoder.onnx` and `decoder_step.onnx`,",
            "with the same results. Re-export the members to get it.",
        ]
    return "\n".join(lines) + "\n"


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before anything is exported, what would fail later or lose files: a missing
    input, a size that is not a positive number, and an ``--out`` that holds anything but a
    package (it is replaced whole: ``--out .`` would have emptied the checkout)."""
    for path in [*args.model, args.results]:
        if not path.is_file():
            parser.error(f"{path}: no such file")
    if not math.isfinite(args.max_mb) or args.max_mb <= 0:
        parser.error(f"--max-mb must be a positive number, got {args.max_mb}")
    out = args.out
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        parser.error(
            f"--out {out}: a folder that holds something other than a package (no "
            "manifest.json); it would be replaced whole, so name a new or a package folder"
        )


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, nargs="+", required=True, help="joblib models")
    parser.add_argument("--results", type=Path, required=True, help="their evaluation JSON")
    parser.add_argument("--out", type=Path, required=True, help="the package folder to write")
    parser.add_argument(
        "--max-mb",
        type=float,
        default=15.5,
        help="drop decode.onnx above this size, MB (default: %(default)s)",
    )
    parser.add_argument("--note", default="", help="more of how it was made, for RECIPE.md")
    parser.add_argument(
        "--quantize",
        choices=sorted(QUANTIZED),
        default=None,
        help="int8 weight products, or float16 weights (half the bytes)",
    )
    parser.add_argument("--dev-words", type=int, default=3000, help="as the members' run")
    parser.add_argument("--seed", type=int, default=0, help="as the members' run")
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    members = [load_saved(path, "--model", Seq2Seq) for path in args.model]
    try:
        results = json.loads(args.results.read_text())
        beam_size = results["config"]["beam_size"]  # the beam its figures were measured at
    except (ValueError, KeyError, TypeError):  # (JSONDecodeError, UnicodeDecodeError)
        parser.error(f"--results {args.results}: not the JSON of examples/g2p_cmudict.py --out")
    if len(members) == 1:
        model = members[0].set_params(beam_size=beam_size)
    else:
        model = Seq2SeqEnsemble.from_fitted(members, beam_size=beam_size)
    with tempfile.TemporaryDirectory() as tmp:
        staged = model.export_onnx(Path(tmp) / "artifact", quantize=args.quantize)
        dropped = directory_mb(staged) > args.max_mb
        if dropped:
            drop_decode_graph(staged)
        record = figures(results, members)
        if args.quantize:
            record = measured_figures(record, staged, args.dev_words, args.seed)
        (staged / "figures.json").write_text(json.dumps(record, indent=2) + "\n")
        (staged / "RECIPE.md").write_text(recipe(args, members, record, dropped))
        (staged / "LICENSE").write_text(cmudict_license())
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.copytree(staged, args.out)
    print(
        f"{args.out}: {directory_mb(args.out):.1f} MB, {sorted(p.name for p in args.out.iterdir())}"
    )
    return args.out


if __name__ == "__main__":
    main()
