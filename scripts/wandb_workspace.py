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
and optimizer state (``out/logz``, ``out/max_logit``, ``optim/below_eps``). Learned scales (``scale/``) are
left to wandb's automatic panels: which exist depends on the norm.
"""

import sys
from pathlib import Path

if not __package__:  # run as a file (python scripts/x.py): it answers with the module command
    import _as_module  # noqa: F401

import argparse

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from omegaconf import OmegaConf

from analysis.load import ReportError, find_run_dirs, read_config
from analysis.presets import CONF, default_choice
from analysis.variants import NORM_KEYS
from runlog.metric_names import (
    ATTENTIONS,
    FAMILY_STATS,
    RESIDUALS,
    WEIGHT_SITES,
    act,
    adam_below_eps,
    attn_max_logit,
    blocks,
    grad_norm,
    matrix_role,
    output_logits,
    weight_spectrum,
)
from runlog.tasks import TaskSpec, read_task, task_spec

MAX_RUNS = 100  # runs a panel draws; a sweep is usually 10-50


def line(title: str, metrics: list[str], log_y: bool = False) -> wr.LinePlot:
    """A line plot of ``metrics`` vs step, each runset group drawn as its mean with a min-max band."""
    return wr.LinePlot(title=title, x="Step", y=metrics, log_y=log_y or None, groupby_aggfunc="mean",
                       groupby_rangefunc="minmax", max_runs_to_show=MAX_RUNS)  # fmt: skip


def _residuals(stack: str) -> tuple[str, ...]:
    """The residual sublayers of a block of ``stack``: an encoder block has no cross-attention."""
    return tuple(r for r in RESIDUALS if stack == "dec" or r != ATTENTIONS[1])


def stability_sections(n_enc_layers: int, n_dec_layers: int) -> list[ws.Section]:
    """Per block, its attentions' max logits and its matrices' spectral norms; then the output logits'
    ``out/`` and the optimizer state's ``optim/below_eps`` (one panel each)."""
    layout = ws.SectionLayoutSettings(columns=max(1, min(n_enc_layers, 4)), rows=2)
    max_logit, sigma_max = [], []
    for stack, i in blocks(n_enc_layers, n_dec_layers):
        logits = [attn_max_logit(stack, i, a) for a in ATTENTIONS if a in _residuals(stack)]
        max_logit.append(line(f"{logits[0].block} attention max logit", [m.name for m in logits]))
        matrices = [m for m in WEIGHT_SITES if matrix_role(m)[0] in _residuals(stack)]
        spectra = [weight_spectrum(stack, i, m, "sigma_max") for m in matrices]
        sigma_max.append(line(f"{spectra[0].block} sigma_max", [m.name for m in spectra], log_y=True))
    whole = [output_logits(stat) for stat in FAMILY_STATS["out"]] + [adam_below_eps()]
    return [
        ws.Section(name="Attention max logit per block", panels=max_logit, layout_settings=layout),
        ws.Section(name="Spectral norm per block", panels=sigma_max, layout_settings=layout),
        ws.Section(name="Output logits and optimizer state", panels=[line(m.name, [m.name]) for m in whole]),
    ]


def task_section(task: TaskSpec) -> ws.Section:
    """The task's metrics: ``val/<key>`` vs step for each, the headline first, and a bar chart of the test metrics."""
    ordered = sorted(task.metrics, key=lambda m: m.key != task.headline)
    tests = [f"test/{m.key}" for m in task.metrics]
    bars = wr.BarPlot(title=" and ".join(tests), metrics=tests, orientation="v", groupby_aggfunc="mean",
                      groupby_rangefunc="minmax", max_runs_to_show=MAX_RUNS)  # fmt: skip
    return ws.Section(name=" / ".join(m.label for m in ordered), is_open=True,
                      panels=[*(line(f"val/{m.key}", [f"val/{m.key}"]) for m in ordered), bars])  # fmt: skip


def build_workspace(entity: str, project: str, group: str, n_enc_layers: int, n_dec_layers: int, task: TaskSpec) -> ws.Workspace:
    """The workspace for sweep ``group`` in ``entity/project`` (built offline; nothing is sent).

    Args:
        n_enc_layers, n_dec_layers: the model's depth, for one RMS and one gradient panel per block.
        task: the runs' task spec, for its metrics' section.

    Raises:
        ValueError: an empty entity, project or group, or a negative layer count.
    """
    if not (entity and project and group):
        raise ValueError(f"entity, project and group must be non-empty, got {entity!r}, {project!r}, {group!r}")
    if n_enc_layers < 0 or n_dec_layers < 0:
        raise ValueError(f"layer counts must be >= 0, got {n_enc_layers} and {n_dec_layers}")
    rms = [act(stack, i, "out", "rms") for stack, i in blocks(n_enc_layers, n_dec_layers)]  # in depth order
    grads = [grad_norm(stack, i) for stack, i in blocks(n_enc_layers, n_dec_layers)]
    sections = [
        ws.Section(name="Loss", is_open=True, panels=[line("train/loss", ["train/loss"]), line("val/loss", ["val/loss"])]),
        task_section(task),
        ws.Section(
            name="Residual RMS per block",
            is_open=True,
            panels=[line(f"{m.block} out RMS", [m.name], log_y=True) for m in rms],
            layout_settings=ws.SectionLayoutSettings(columns=max(1, min(n_enc_layers, 4)), rows=2),
        ),
        ws.Section(
            name="Gradient norm per block",
            panels=[line(f"{m.block} grad norm", [m.name], log_y=True) for m in grads],
            layout_settings=ws.SectionLayoutSettings(columns=max(1, min(n_enc_layers, 4)), rows=2),
        ),
        *stability_sections(n_enc_layers, n_dec_layers),
    ]
    return ws.Workspace(
        entity=entity,
        project=project,
        name=f"normlab sweep {group}",
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis="Step", max_runs=MAX_RUNS),
        runset_settings=ws.RunsetSettings(
            filters=[ws.Metric("Group") == group],
            groupby=[ws.Config(key) for key in NORM_KEYS],  # the keys the local report labels variants by
        ),
    )


def sweep_facts(run_dir: Path | None) -> tuple[int, int, TaskSpec]:
    """(``model.n_enc_layers``, ``model.n_dec_layers``, task spec) of the first run under ``run_dir`` (a run directory
    or a sweep directory), or of the default config (``conf/config.yaml``'s model and data presets) for None.

    Raises:
        ValueError: no run under ``run_dir``, its config lacks the two keys, or its task.json is unreadable.
    """
    if run_dir is None:
        model = OmegaConf.load(CONF / "model" / f"{default_choice('model')}.yaml")
        data = OmegaConf.load(CONF / "data" / f"{default_choice('data')}.yaml")
        return model.n_enc_layers, model.n_dec_layers, task_spec(data.task)
    try:
        found = find_run_dirs([run_dir])
    except ReportError as e:
        raise ValueError(str(e)) from e
    if not found:
        raise ValueError(f"no run directory (config.yaml with metrics.jsonl or status.json) under {str(run_dir)!r}")
    config = read_config(found[0][0] / "config.yaml")
    keys = ("model.n_enc_layers", "model.n_dec_layers")
    if any(k not in config for k in keys):
        raise ValueError(f"{found[0][0] / 'config.yaml'} has no {' and '.join(keys)}; pass --n-enc-layers and --n-dec-layers")
    return config[keys[0]], config[keys[1]], read_task(found[0][0])


def outline(workspace: ws.Workspace) -> str:
    """A few lines naming the workspace's sections and panels."""
    lines = [f"{workspace.name}: {workspace.entity}/{workspace.project}"]
    for section in workspace.sections:
        titles = ", ".join(p.title or "?" for p in section.panels)
        lines.append(f"  {section.name} ({len(section.panels)}): {titles}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 with ``wandb_workspace: error: ...`` on failure)."""
    parser = argparse.ArgumentParser(prog="wandb_workspace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--project", required=True, help="W&B project (logger.project)")
    parser.add_argument("--group", required=True, help="the sweep's wandb group (logger.group)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="a run dir or the sweep dir: the layer counts and the task come from its first run")  # fmt: skip
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
        except Exception as e:  # no API key, no network, permission: say which, without a traceback
            print(f"wandb_workspace: error: saving failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"saved: {saved.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
