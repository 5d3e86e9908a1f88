"""Decode lines with a trained checkpoint: translate sentences, or spell words as phonemes (G2P).

    python -m scripts.predict outputs/<date>/<time>_pre-layernorm-custom sentences.txt --beam-size 5
    echo "phoneme" | python -m scripts.predict RUN_DIR -          # G2P: F OW N IY M

RUN_DIR is a run directory (its ``checkpoint.pt``: the last step's weights) or a checkpoint file, e.g. the
weights a run's final test scored with ``trainer.test_checkpoint=best`` (``RUN_DIR/best.pt``) or
``trainer.average_last`` (``RUN_DIR/averaged.pt``). One output line per input
line on stdout, in order, from the checkpoint's own vocabularies and model config. Before them, on
stderr: the checkpoint's step and the run's test metrics (``status.json``), and for each input line
the characters the model cannot read (not in its vocabulary: read as ``<unk>``, e.g. the digits of
``abc123`` for G2P) or that were cut off (beyond ``model.max_len``). The task's spec (``task.json`` next to
the checkpoint: ``runlog.tasks.read_task``) says how metrics are shown and an input line is read
(G2P: stripped and lower-cased, as CMUdict's words). Decoding is the one the runs use
(``training.evaluate.decode_all``: batched beam search with the incremental decoder cache;
``--beam-size 1`` is greedy).
"""

import argparse
import sys
from pathlib import Path

import torch

from training.checkpoint import load_checkpoint
from training.devices import parse_device
from training.evaluate import DecodeConfig
from training.predict import checkpoint_path, describe, from_checkpoint, input_notes, predict, read_input


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: predictions on stdout, the checkpoint's step, test metrics and input notes on stderr;
    exits with ``predict: error: ...`` on a missing or bad checkpoint or input file (a directory too), a ``--device``
    not of this machine (``training.devices.parse_device``) or ``--max-tokens`` < 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint",
        metavar="RUN_DIR",
        help="a run directory written by train.py, or a checkpoint file (checkpoint.pt, best.pt, averaged.pt)",
    )
    parser.add_argument("input", nargs="?", default="-", help="text file, one sentence (or word) per line; - or none: stdin")
    default = DecodeConfig()  # the run's decode defaults (conf/config.yaml)
    parser.add_argument(
        "--beam-size",
        type=int,
        default=default.beam_size,
        help=f"hypotheses kept per sentence; 1 is greedy (default {default.beam_size})",
    )
    parser.add_argument(
        "--length-penalty", type=float, default=default.length_penalty, help=f"GNMT alpha (default {default.length_penalty})"
    )
    parser.add_argument("--max-tokens", type=int, default=4096, help="token budget of one decoding batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        dcfg = DecodeConfig(beam_size=args.beam_size, length_penalty=args.length_penalty)
        device = parse_device(args.device)
        if args.max_tokens < 1:
            raise ValueError(
                f"--max-tokens {args.max_tokens} is invalid; it must be an integer >= 1 (tokens in one "
                f"decoding batch; default 4096)"
            )
        path = checkpoint_path(args.checkpoint)
        ckpt = load_checkpoint(path)
        model, src, tgt, task = from_checkpoint(ckpt, path, device)
        text = sys.stdin.read() if args.input == "-" else read_input(Path(args.input))
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"predict: error: {e}")
    lines = text.splitlines()
    print("\n".join([describe(ckpt, path, task), *input_notes(lines, src, task, model.cfg.max_len)]), file=sys.stderr)
    print("\n".join(predict(lines, model, src, tgt, task, dcfg, args.max_tokens, device)))


if __name__ == "__main__":
    main()
