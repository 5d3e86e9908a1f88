"""The command line of ``python -m scripts.bench``: one subcommand per benchmark, its options, and which ``bench_*``
function each runs."""

import argparse
import tempfile
from pathlib import Path
from typing import TypeAlias

import torch

from benchmarks.model import SIZES, bench_model
from benchmarks.norms import NORM_PRESETS, NORM_VARIANTS, TOKEN_WISE, bench_norms, bench_step
from benchmarks.optim import bench_optim
from benchmarks.precision import bench_loss_gap
from benchmarks.steps import MODEL_SIZES, bench_dropout, bench_precision_steps, bench_profile, bench_telemetry
from benchmarks.timing import CLOCKS
from training.schema import PRECISIONS

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def bench_parser(description: str) -> argparse.ArgumentParser:
    """The parser of every subcommand (``norms``, ``telemetry``, ``model``, ``precision``, ``profile``, ``dropout``,
    ``optim``);
    ``args.what`` names the one given."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    for add in (_add_norms, _add_telemetry, _add_model, _add_precision, _add_profile, _add_dropout, _add_optim):
        add(sub)
    return parser


def run_bench(args: argparse.Namespace) -> list[dict]:
    """Run the benchmark ``args.what`` names (it prints its tables); the ratio rows of ``norms`` (``ratio_row``s, for
    ``--csv``), none for the others."""
    if args.what in ("precision", "profile", "dropout", "optim"):
        torch.set_num_threads(args.threads)
    if args.what == "model":
        bench_model(args.sizes, torch.device(args.device), args.rounds, args.compile, args.rows, args.length, args.precision)
    if args.what == "precision":
        bench_precision_steps(args.sizes, args.rounds, args.clock)
        if args.loss_steps:
            with tempfile.TemporaryDirectory() as out:
                bench_loss_gap(Path(out), args.model, args.loss_steps, args.seeds)
    if args.what == "dropout":
        bench_dropout(args.size, args.dropout, args.rounds, args.clock)
    if args.what == "optim":
        bench_optim(args.size, args.rounds, args.clock)
    if args.what == "profile":
        bench_profile(args.sizes, args.dropout, args.attn_dropout, args.warmup, args.steps)
    if args.what == "telemetry":
        bench_telemetry(args.rounds, args.window, args.compile, args.dropout)
    if args.what != "norms":
        return []
    ratios = bench_norms(args.kinds, args.dims, args.rows, args.rounds, args.compile, args.clock)
    if args.step:
        ratios += bench_step(args.step_rounds or max(args.rounds // 3, 3), args.presets, args.clock)
    return ratios


def _add_norms(sub: Subcommands) -> None:
    norms = sub.add_parser("norms", help="norm kinds x impls, and a training step per preset")
    norms.add_argument(
        "--kinds",
        nargs="+",
        choices=sorted({v[0] for v in NORM_VARIANTS}),
        default=TOKEN_WISE,
        help="norm kinds of the norm-alone tables (native LayerNorm, the baseline, always runs)",
    )
    norms.add_argument("--dims", type=int, nargs="+", default=[256, 512, 1024])
    norms.add_argument("--rows", type=int, nargs="+", default=[8192], help="B*T rows of the benchmarked tensor, one table each")
    norms.add_argument("--rounds", type=int, default=15)
    norms.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    norms.add_argument("--no-step", dest="step", action="store_false", help="skip the training-step table")
    norms.add_argument("--presets", nargs="+", choices=NORM_PRESETS, default=NORM_PRESETS, help="norm presets of the step table")
    norms.add_argument("--step-rounds", type=int, default=None, help="rounds of the step table (default: max(rounds // 3, 3))")
    norms.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: this process's CPU time (see CLOCKS)")
    norms.add_argument("--csv", type=Path, default=None, help="also write the ratio tables to this CSV (see RATIO_COLUMNS)")


def _add_telemetry(sub: Subcommands) -> None:
    tele = sub.add_parser("telemetry", help="step-time overhead of each telemetry preset vs off")
    tele.add_argument("--rounds", type=int, default=5)
    tele.add_argument("--window", type=int, default=50, help="consecutive steps per timing (light records once per 50)")
    tele.add_argument("--compile", action="store_true", help="compile every layer, as trainer.compile=true does")
    tele.add_argument("--dropout", type=float, default=None, help="model dropout (default: conf/model/small.yaml's)")


def _add_model(sub: Subcommands) -> None:
    model = sub.add_parser("model", help="a training step of normlab vs torch.nn.Transformer, same sizes and batch")
    model.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["small", "base"])
    model.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    model.add_argument("--compile", action="store_true", help="torch.compile every layer of both models")
    model.add_argument("--rounds", type=int, default=10)
    model.add_argument("--rows", type=int, default=256, help="sentences per batch")
    model.add_argument("--length", type=int, default=16, help="src and tgt positions per sentence (padded)")
    model.add_argument("--precision", choices=PRECISIONS, default="auto", help="as trainer.precision (auto: bf16 on cuda)")


def _add_precision(sub: Subcommands) -> None:
    prec = sub.add_parser("precision", help="bf16 autocast / fp32 step time per model size, and the loss gap of short runs")
    prec.add_argument("--sizes", nargs="+", choices=MODEL_SIZES, default=MODEL_SIZES, help="model presets (conf/model/)")
    prec.add_argument("--rounds", type=int, default=5)
    prec.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: this process's CPU time (see CLOCKS)")
    prec.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's fair share)")
    prec.add_argument("--loss-steps", type=int, default=200, help="steps of each G2P run of the loss gap (0: skip it)")
    prec.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one fp32 and one bf16 run per seed")
    prec.add_argument("--model", choices=MODEL_SIZES, default="small", help="model preset of the G2P runs")


def _add_profile(sub: Subcommands) -> None:
    prof = sub.add_parser("profile", help="where a training step's time goes, per model size (torch.profiler)")
    prof.add_argument("--sizes", nargs="+", choices=MODEL_SIZES, default=["tiny", "small"], help="model presets (conf/model/)")
    prof.add_argument("--dropout", type=float, default=None, help="model.dropout (default: each preset's)")
    prof.add_argument("--attn-dropout", type=float, default=None, help="model.attn_dropout (default: each preset's)")
    prof.add_argument("--warmup", type=int, default=2, help="unprofiled steps first")
    prof.add_argument("--steps", type=int, default=3, help="profiled steps")
    prof.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's fair share)")


def _add_dropout(sub: Subcommands) -> None:
    drop = sub.add_parser("dropout", help="the step with normlab's Dropout vs nn.Dropout, and with attn_dropout 0")
    drop.add_argument("--size", choices=MODEL_SIZES, default="small", help="model preset (conf/model/)")
    drop.add_argument("--dropout", type=float, default=0.1, help="model.dropout (attn_dropout and act_dropout follow it)")
    drop.add_argument("--rounds", type=int, default=7)
    drop.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: this process's CPU time (see CLOCKS)")
    drop.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's fair share)")


def _add_optim(sub: Subcommands) -> None:
    optim = sub.add_parser("optim", help="the step under AdamW, and under Muon with bfloat16 and float32 Newton-Schulz")
    optim.add_argument("--size", choices=MODEL_SIZES, default="small", help="model preset (conf/model/)")
    optim.add_argument("--rounds", type=int, default=7)
    optim.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: this process's CPU time (see CLOCKS)")
    optim.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's fair share)")
