"""A saved W&B workspace for one sweep: its runs, grouped by norm, with loss, task metric and per-layer panels.

    python -m scripts.wandb_workspace --entity E --project P --group G --run-dir multirun/<preset>/<date_time> [--save]

The model's depth (one panel per block) is read from the ``model.n_enc_layers`` and ``model.n_dec_layers`` of the
first run's ``config.yaml`` under ``--run-dir`` (a run dir or the sweep dir), and the task's metrics from its
``task.json`` (``runlog.tasks.read_task``); ``--n-enc-layers`` and ``--n-dec-layers`` override the depth, and
without ``--run-dir`` the default config's depth and task are used (``conf/config.yaml``).
Without ``--save`` it only builds the workspace and prints its outline (no network, no API key).
``--save`` uploads it (needs ``WANDB_API_KEY`` or ``wandb login``) and prints its URL.

The workspace shows the runs whose wandb group is G (train.py sets it from ``logger.group``), grouped by
``norm.placement``, ``norm.kind`` and ``norm.impl`` (each group drawn as the mean over its runs with a min-max
band), in sections: loss, the task's metrics (PER/WER, or BLEU/chrF; its headline first), the RMS of the
residual stream leaving each block (``act/{enc|dec}.{i}.out/rms``, log scale), each block's gradient norm
(``grad/{enc|dec}.{i}/norm``), each block's attention max logits (``attn/{enc|dec}.{i}.{a}/max_logit``), each
block's matrices' spectral norms (``weight/{enc|dec}.{i}.{m}/sigma_max``, log scale), and the output logits
and optimizer state (``out/logz``, ``out/max_logit``, ``optim/below_eps``, ``optim/qk_clip_count``,
``optim/qk_clip_min_factor``). Learned scales (``scale/``) are
left to wandb's automatic panels: which exist depends on the norm.
"""

import argparse
import os
import sys
from pathlib import Path

from reporting.wandb_workspace import build_workspace, outline, sweep_facts


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 with ``wandb_workspace: error: ...`` on failure)."""
    parser = argparse.ArgumentParser(prog="wandb_workspace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--project", required=True, help="W&B project (logger.project)")
    parser.add_argument("--group", required=True, help="the sweep's wandb group (logger.group)")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="a run dir or the sweep dir: the layer counts and the task come from its first run",
    )
    parser.add_argument("--n-enc-layers", type=int, default=None, help="encoder layers (default: from --run-dir)")
    parser.add_argument("--n-dec-layers", type=int, default=None, help="decoder layers (default: from --run-dir)")
    parser.add_argument("--save", action="store_true", help="upload the workspace (needs a W&B API key)")
    args = parser.parse_args(argv)
    try:
        n_enc, n_dec, task = sweep_facts(args.run_dir)
        n_enc = n_enc if args.n_enc_layers is None else args.n_enc_layers
        n_dec = n_dec if args.n_dec_layers is None else args.n_dec_layers
        workspace = build_workspace(args.entity, args.project, args.group, n_enc, n_dec, task)
    except ValueError as e:
        print(f"wandb_workspace: error: {e}", file=sys.stderr)
        return 1
    print(outline(workspace))
    if args.save:
        try:
            saved = workspace.save()
        except Exception as e:  # no API key, no network, permission, a server without workspaces: one line, no traceback
            server = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
            why = " ".join(f"{type(e).__name__}: {e}".split())
            hint = "workspaces need W&B's cloud or W&B Server"
            print(f"wandb_workspace: error: saving to {server} failed ({hint}): {why}", file=sys.stderr)
            return 1
        print(f"saved: {saved.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
