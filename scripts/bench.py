"""Benchmarks, printed as ratios measured side by side in one run.

    python -m scripts.bench norms                 # each norm kind x impl, eager and compiled, + a training step per preset
    python -m scripts.bench norms --no-compile --dims 256
    python -m scripts.bench norms --kinds layernorm rmsnorm batchnorm --dims 64 256 512 --rows 2048 8192 \
        --presets pre_ln pre_rms pre_bn           # RMSNorm / LayerNorm and custom / native, norm alone and in a step
    python -m scripts.bench norms --clock cpu --csv ratios.csv   # + those ratio tables as one CSV (RATIO_COLUMNS)
    python -m scripts.bench telemetry             # step-time overhead of telemetry=light|full vs off
    python -m scripts.bench telemetry --compile --dropout 0.1   # the same with compiled layers, + inductor's own RNG
    python -m scripts.bench model                 # a training step, normlab vs torch.nn.Transformer (benchmarks/model.py)
    python -m scripts.bench precision             # bf16 autocast / fp32 step time per model size, + 200 steps of G2P each
    python -m scripts.bench precision --sizes small --seeds 0 --loss-steps 50   # a quicker look
    python -m scripts.bench model --device cuda --compile
    python -m scripts.bench profile               # where a training step's time goes, per model size (torch.profiler)
    python -m scripts.bench profile --sizes small --dropout 0.1 --steps 5
    python -m scripts.bench dropout               # the step with normlab's Dropout vs nn.Dropout, and attn_dropout 0 vs p
    python -m scripts.bench optim                 # the step under AdamW and Muon (bfloat16 and float32 Newton-Schulz)

Run from the repository root (``python -m`` puts it on the import path).

Variants are timed in alternating rounds (A B C A B C ...) so that drift of a shared machine hits
all of them alike; each time is the median over rounds, each ratio of ``norms`` the median of the
per-round ratios. Ratios > 1 are slower than the baseline.
"""

import os

from benchmarks.commands import bench_parser, run_bench
from benchmarks.timing import write_ratios_csv


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    load_before = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {load_before}, {os.cpu_count()} CPUs")
    ratios = run_bench(args)
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) after: {load_after}")
    if args.what == "norms" and args.csv:
        write_ratios_csv(args.csv, ratios, args.clock, load_before[0], load_after[0])
        print(f"ratios written to {args.csv}")


if __name__ == "__main__":
    main()
