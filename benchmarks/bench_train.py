"""Training throughput of ``Seq2SeqModule``: target tokens per second for one full training step
(teacher-forced forward, backward, Adam update) on a synthetic reversal batch.

Prints one row per decoder x scorer (global attention), then the parallel Luong path (no input
feeding: the decoder RNN runs over the whole target in one call and attention for all steps is
one batched product) against the *same* model forced to run one decoder step at a time
(``Seq2SeqModule.forward_stepwise``), for the whole model and for the decoder alone. The
encoder, a bidirectional RNN that both paths share, caps the whole-model ratio: its share of a
parallel training step and the resulting ceiling (the whole-model speed-up if the parallel
decoder cost nothing) are printed beside them.

    python benchmarks/bench_train.py            # full run
    python benchmarks/bench_train.py --quick    # a few seconds, smaller batch
"""

from __future__ import annotations

import argparse
import statistics
import time

import machine
import torch
from torch import nn

from skattn.models import ModelConfig, Seq2SeqModule
from skattn.models.decoders import step_loop
from skattn.training import AUTOCAST_DTYPES, adam

SCORERS = ("dot", "general", "additive", "scaled_dot")
DECODERS = (  # (label, constructor overrides)
    ("bahdanau", dict(decoder="bahdanau")),
    ("luong", dict(decoder="luong", input_feeding=False)),
    ("luong+feed", dict(decoder="luong", input_feeding=True)),
)
PAD, BOS, EOS, FIRST_TOKEN = 0, 1, 2, 4


def reversal_batch(batch_size: int, length: int, vocab_size: int, generator: torch.Generator):
    """Random sequences of ``length`` tokens, the source ending in EOS, the target reversed."""
    tokens = torch.randint(FIRST_TOKEN, vocab_size, (batch_size, length), generator=generator)
    eos = torch.full((batch_size, 1), EOS)
    bos = torch.full((batch_size, 1), BOS)
    src = torch.cat([tokens, eos], dim=1)  # (B, T)
    lengths = torch.full((batch_size,), length + 1)  # (B,)
    tgt_in = torch.cat([bos, tokens.flip(1)], dim=1)  # (B, T_y)
    tgt_out = torch.cat([tokens.flip(1), eos], dim=1)  # (B, T_y)
    return src, lengths, tgt_in, tgt_out


def make_forward(model: Seq2SeqModule, batch, *, stepwise: bool, decoder_only: bool):
    """A closure returning the teacher-forced logits ``(B, T_y, V)`` for ``batch``.

    ``decoder_only`` encodes once, without gradients, and times the decoder alone (the part
    that the parallel path changes); otherwise the encoder runs and trains in every step.
    """
    src, lengths, tgt_in, _ = batch
    if not decoder_only:
        forward = model.forward_stepwise if stepwise else model.forward
        return lambda: forward(src, lengths, tgt_in)[0]
    with torch.no_grad():
        memory, keys, mask, state = model.encode(src, lengths)
    if stepwise:
        return lambda: step_loop(model.decoder.step, tgt_in, state, memory, keys, mask)[0]
    return lambda: model.decoder(tgt_in, state, memory, keys, mask)[0]


def tokens_per_second(
    model: Seq2SeqModule,
    batch,
    *,
    stepwise: bool = False,
    decoder_only: bool = False,
    steps: int,
    repeats: int,
    clock=time.process_time,
    precision: str = "float32",
) -> float:
    """Median over ``repeats`` of target tokens / s for ``steps`` full training steps, the
    forward pass under ``torch.autocast`` with ``precision="bfloat16"`` (what
    ``Seq2Seq(precision="bfloat16")`` trains with)."""
    tgt_out = batch[3]
    autocast = AUTOCAST_DTYPES[precision]
    optimizer = adam(model.parameters(), 1e-3)  # the estimator's
    model.train()
    forward = make_forward(model, batch, stepwise=stepwise, decoder_only=decoder_only)
    vocab_size = model.config.target_vocab_size

    def train_step():
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            logits = forward()  # (B, T_y, V)
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, vocab_size), tgt_out.reshape(-1), ignore_index=PAD
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    train_step()  # warm-up: allocator, autograd graph caches
    rates = []
    for _ in range(repeats):
        start = clock()
        for _ in range(steps):
            train_step()
        rates.append(steps * tgt_out.numel() / (clock() - start))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=20, help="source tokens before EOS")
    parser.add_argument("--vocab-size", type=int, default=30)
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--cell", choices=("gru", "lstm"), default="gru")
    parser.add_argument("--steps", type=int, default=5, help="training steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: these matrices are small, and extra OpenMP "
        "threads spin against each other on a busy 2-core machine)",
    )
    parser.add_argument(
        "--clock",
        choices=("process", "wall"),
        default="process",
        help="process: CPU seconds of this process (with one thread, wall time on an idle "
        "machine, and unaffected by other jobs sharing the cores); wall: elapsed seconds",
    )
    parser.add_argument("--quick", action="store_true", help="small batch, one repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.length, args.steps, args.repeats = 16, 10, 2, 1

    torch.set_num_threads(args.threads)
    clock = {"process": time.process_time, "wall": time.perf_counter}[args.clock]
    generator = torch.Generator().manual_seed(0)
    batch = reversal_batch(args.batch_size, args.length, args.vocab_size, generator)
    sizes = dict(embedding_dim=args.embedding_dim, hidden_size=args.hidden_size, cell=args.cell)

    def build(**overrides) -> Seq2SeqModule:
        torch.manual_seed(0)
        return Seq2SeqModule(ModelConfig(args.vocab_size, args.vocab_size, **sizes, **overrides))

    print(machine.describe())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; cell={args.cell}, "
        f"batch={args.batch_size}, target length={args.length + 1}, "
        f"embedding_dim={args.embedding_dim}, hidden_size={args.hidden_size}; "
        f"median of {args.repeats} x {args.steps} steps, {args.clock} time"
    )
    print("\ntraining tokens/s (forward + backward + Adam), global attention")
    print(f"{'decoder':<12}" + "".join(f"{scorer:>12}" for scorer in SCORERS))
    for label, overrides in DECODERS:
        rates = [
            tokens_per_second(
                build(scorer=scorer, **overrides),
                batch,
                steps=args.steps,
                repeats=args.repeats,
                clock=clock,
            )
            for scorer in SCORERS
        ]
        print(f"{label:<12}" + "".join(f"{rate:>12,.0f}" for rate in rates))

    print("\nLuong without input feeding: parallel forward vs the same model step by step")
    print(f"{'':<12}{'whole model':^34}{'decoder only':^34}{'encoder':>10}{'ceiling':>10}")
    header = f"{'parallel':>12}{'stepwise':>12}{'speed-up':>10}"
    print(f"{'scorer':<12}{header}{header}{'share':>10}{'':>10}")
    tokens = batch[3].numel()
    for scorer in SCORERS:
        model = build(scorer=scorer, decoder="luong", input_feeding=False)
        row, seconds = f"{scorer:<12}", {}
        for decoder_only in (False, True):
            parallel, stepwise = (
                tokens_per_second(
                    model,
                    batch,
                    stepwise=flag,
                    decoder_only=decoder_only,
                    steps=args.steps,
                    repeats=args.repeats,
                    clock=clock,
                )
                for flag in (False, True)
            )
            seconds[decoder_only] = (tokens / parallel, tokens / stepwise)  # per training step
            row += f"{parallel:>12,.0f}{stepwise:>12,.0f}{parallel / stepwise:>9.1f}x"
        # What the parallel path cannot change: the encoder's forward and backward, the same in
        # both paths. Even a decoder that cost nothing would leave the whole model at most
        # (encoder + stepwise decoder) / encoder faster (Amdahl's law).
        encoder = max(seconds[False][0] - seconds[True][0], 1e-12)
        ceiling = (encoder + seconds[True][1]) / encoder
        row += f"{encoder / seconds[False][0]:>9.0%}{ceiling:>9.1f}x"
        print(row)


if __name__ == "__main__":
    main()
