"""Decode lines with a trained checkpoint: translate sentences, or spell words as phonemes (G2P).

    python -m scripts.predict outputs/<date>/<time>_pre-layernorm-custom/checkpoint.pt sentences.txt --beam-size 5
    echo "phoneme" | python -m scripts.predict RUN_DIR/checkpoint.pt -          # G2P: F OW N IY M

One output line per input line, in order, from the checkpoint's own vocabularies and model
config. Decoding is the one the runs use (``training.evaluate.decode_all``: batched beam search
with the incremental decoder cache; ``--beam-size 1`` is greedy).
"""

import sys
from pathlib import Path

if not __package__:  # run as a file (python scripts/x.py), which cannot import the project's packages
    sys.exit(f"normlab: run it as a module from the repository root: cd {Path(__file__).resolve().parents[1]} && "
             f"python -m scripts.{Path(__file__).stem} {' '.join(sys.argv[1:])}".rstrip())  # fmt: skip

import argparse

import torch
from tokenizers import Tokenizer

from data.tokenizer import detokenize, encode_all
from model import EncoderDecoder, ModelConfig, NormConfig
from training.checkpoint import load_checkpoint
from training.evaluate import DecodeConfig, decode_all


def model_from(ckpt: dict) -> EncoderDecoder:
    """The model of a loaded checkpoint (``training.checkpoint.load_checkpoint``), its weights loaded, on the CPU."""
    mcfg = dict(ckpt["model_config"])
    model = EncoderDecoder(ModelConfig(**{**mcfg, "norm": NormConfig(**mcfg["norm"])}))
    model.load_state_dict(ckpt["model"])
    return model


def load_model(path: str, device: torch.device) -> tuple[EncoderDecoder, Tokenizer, Tokenizer, str]:
    """(model in eval mode, src vocabulary, tgt vocabulary, task name) from a normlab checkpoint."""
    ckpt = load_checkpoint(path)
    model = model_from(ckpt)
    src, tgt = (Tokenizer.from_str(ckpt["vocab"][k]) for k in ("src", "tgt"))
    return model.to(device).eval(), src, tgt, ckpt.get("task", "g2p")


def predict(lines: list[str], model: EncoderDecoder, src: Tokenizer, tgt: Tokenizer, task: str, dcfg: DecodeConfig,
            max_tokens: int, device: torch.device) -> list[str]:  # fmt: skip
    """One output string per input line (an empty line gives an empty output)."""
    if task == "g2p":
        lines = [line.strip().lower() for line in lines]  # CMUdict words are lower-cased letters
    ids = [x[: model.cfg.max_len - 1] for x in encode_all(src, lines)]
    todo = [i for i, x in enumerate(ids) if x]
    hyps = decode_all(model, [ids[i] for i in todo], dcfg, max_tokens, device)
    out = [""] * len(lines)
    for i, hyp in zip(todo, hyps, strict=True):
        out[i] = detokenize(tgt, hyp)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint.pt written by train.py")
    parser.add_argument("input", nargs="?", default="-", help="text file, one sentence (or word) per line; - or none: stdin")
    parser.add_argument("--beam-size", type=int, default=5, help="hypotheses kept per sentence; 1 is greedy (default 5)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="GNMT alpha (default 0.6)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="token budget of one decoding batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        dcfg = DecodeConfig(beam_size=args.beam_size, length_penalty=args.length_penalty)
        device = torch.device(args.device)
        model, src, tgt, task = load_model(args.checkpoint, device)
        text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text(encoding="utf-8")
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"predict: error: {e}")
    lines = text.splitlines()
    print("\n".join(predict(lines, model, src, tgt, task, dcfg, args.max_tokens, device)))


if __name__ == "__main__":
    main()
