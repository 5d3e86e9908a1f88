"""Expected wall time of a preset's runs on one GPU, from counted FLOPs and an assumed MFU.

    python -m scripts.estimate_time +experiment=lr_sensitivity_gpu            # every job of the sweep
    python -m scripts.estimate_time +experiment=lr_sensitivity_gpu --mfu 0.3  # another MFU
    python -m scripts.estimate_time model=base trainer.max_steps=20000        # one run

The arguments are train.py's overrides, composed from conf/ as train.py composes them; a sweep preset's
``hydra.sweeper.params`` and comma-separated values expand into its jobs as Hydra's basic sweeper expands them
(``-m`` is implied). For each distinct model, data, trainer and decode setting among the jobs:

- FLOPs per step: ``training.flops.counted_train_flops`` (``torch.utils.flop_counter.FlopCounterMode``) on one
  training step, forward and backward, of the run's first batches (``data.batching.train_stream``: a batch
  fills the token budget ``trainer.max_tokens``), the model and batch on the meta device; beside it the formula
  of ``training.flops.train_flops`` on the same batch (Hoffmann et al. 2022, App. F: 6 x matmul parameters x
  the tokens each stack sees, plus the attention scores), which train.py's ``perf/mfu`` uses;
- evaluation: the validation loss (a forward pass over the whole valid split at step 0 and at each validation)
  and decoding (each validation's ``trainer.eval_max_examples`` and the final test's ``trainer.test_max_examples``,
  every row run to ``decode.max_len``, times the beam: an upper bound), in FLOPs by the formula (forward =
  1/3 of a training step);
- wall time per run = (steps x counted FLOPs per step + evaluation FLOPs) / (peak x MFU).

The peak is the GPU's dense bf16 Tensor Core rate (``training.flops.PEAK_BF16_FLOPS``; the H200 SXM's 989
TFLOP/s is NVIDIA's data-sheet 1,979 "with sparsity", halved). The MFU is an assumption, not a measurement:
its default, 0.15, is for a small model. PaLM reports 46 % for a 540B model and 21 % for GPT-3 (Chowdhery
et al. 2022, Table 3); nanoGPT users report 29 % for the 124M GPT-2 on an RTX 4090, 7-8 % on an older card
without torch.compile (karpathy/nanoGPT issue 182). Transformer-base on G2P's short rows does a step's
matmuls in milliseconds at the peak, so an eager step's kernel launches and host-side batching weigh as much.
Plausible range 0.05-0.3; ``bash scripts/gpu_check.sh`` prints the ``perf/mfu`` a GPU reaches on this model
(``--mfu`` takes it). Left out: start-up (imports, data, model), checkpoint writes, and decoding's latency
(its decoder calls run one after another; their count is printed).
"""

import argparse
import sys
from typing import TYPE_CHECKING

from training.flops import PEAK_BF16_FLOPS

if TYPE_CHECKING:
    pass
from benchmarks.estimate_time import DEFAULT_GPU, DEFAULT_MFU, estimate, table, wall_seconds


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (2 with ``estimate_time: error: ...`` on bad input or data
    that cannot be loaded)."""
    parser = argparse.ArgumentParser(prog="estimate_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="train.py's overrides, e.g. +experiment=lr_sensitivity_gpu")
    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU, help=f"assumed model FLOPs utilization (default {DEFAULT_MFU})")
    parser.add_argument("--gpu", choices=sorted(PEAK_BF16_FLOPS), default=DEFAULT_GPU, help=f"whose peak (default {DEFAULT_GPU})")
    args = parser.parse_args([a for a in (sys.argv[1:] if argv is None else argv) if a not in ("-m", "--multirun")])
    try:
        wall_seconds(1.0, 1.0, args.mfu)  # checks --mfu before the jobs are counted
        print(table(estimate(args.overrides), args.gpu, args.mfu))
    except (ValueError, FileNotFoundError) as e:  # FileNotFoundError: data that is neither cached nor reachable
        print(f"estimate_time: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
