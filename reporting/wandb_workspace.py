"""The wandb workspace of ``python -m scripts.wandb_workspace``: the sections and panels of a sweep's dashboard
(loss, the task's metrics, the stability telemetry per layer), built with wandb-workspaces."""

from pathlib import Path

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from wandb_workspaces.reports.v2.interface import PanelTypes

from analysis.load import ReportError, find_run_dirs, read_config
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
    qk_clip_stat,
    weight_spectrum,
)
from runlog.tasks import TaskSpec, read_task, task_spec
from training.presets import group_keys

MAX_RUNS = 100  # runs a panel draws; a sweep is usually 10-50


def line(title: str, metrics: list[str], log_y: bool = False) -> wr.LinePlot:
    """A line plot of ``metrics`` vs step, each runset group drawn as its mean with a min-max band."""
    return wr.LinePlot(
        title=title,
        x="Step",
        y=[*metrics],
        log_y=log_y or None,
        groupby_aggfunc="mean",
        groupby_rangefunc="minmax",
        max_runs_to_show=MAX_RUNS,
    )


def _residuals(stack: str) -> tuple[str, ...]:
    """The residual sublayers of a block of ``stack``: an encoder block has no cross-attention."""
    return tuple(r for r in RESIDUALS if stack == "dec" or r != ATTENTIONS[1])


def stability_sections(n_enc_layers: int, n_dec_layers: int) -> list[ws.Section]:
    """Per block, its attentions' max logits and its matrices' spectral norms (the attention gate's too: empty in a run
    without ``model.attn_gate``); then the output logits'
    ``out/``, the optimizer state's ``optim/below_eps`` and QK-Clip's ``optim/qk_clip_{count,min_factor}`` (one panel each)."""
    layout = ws.SectionLayoutSettings(columns=max(1, min(n_enc_layers, 4)), rows=2)
    max_logit: list[PanelTypes] = []
    sigma_max: list[PanelTypes] = []
    for stack, i in blocks(n_enc_layers, n_dec_layers):
        logits = [attn_max_logit(stack, i, a) for a in ATTENTIONS if a in _residuals(stack)]
        max_logit.append(line(f"{logits[0].block} attention max logit", [m.name for m in logits]))
        matrices = [m for m in WEIGHT_SITES if matrix_role(m)[0] in _residuals(stack)]
        spectra = [weight_spectrum(stack, i, m, "sigma_max") for m in matrices]
        sigma_max.append(line(f"{spectra[0].block} sigma_max", [m.name for m in spectra], log_y=True))
    whole = [output_logits(stat) for stat in FAMILY_STATS["out"]] + [adam_below_eps()]
    whole += [qk_clip_stat(stat) for stat in ("count", "min_factor")]  # empty panels in runs without optim.qk_clip
    return [
        ws.Section(name="Attention max logit per block", panels=max_logit, layout_settings=layout),
        ws.Section(name="Spectral norm per block", panels=sigma_max, layout_settings=layout),
        ws.Section(name="Output logits and optimizer state", panels=[line(m.name, [m.name]) for m in whole]),
    ]


def task_section(task: TaskSpec) -> ws.Section:
    """The task's metrics: ``val/<key>`` vs step for each, the headline first, and a bar chart of the test metrics."""
    ordered = sorted(task.metrics, key=lambda m: m.key != task.headline)
    tests = [f"test/{m.key}" for m in task.metrics]
    bars = wr.BarPlot(
        title=" and ".join(tests),
        metrics=[*tests],
        orientation="v",
        groupby_aggfunc="mean",
        groupby_rangefunc="minmax",
        max_runs_to_show=MAX_RUNS,
    )
    return ws.Section(
        name=" / ".join(m.label for m in ordered),
        is_open=True,
        panels=[*(line(f"val/{m.key}", [f"val/{m.key}"]) for m in ordered), bars],
    )


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
        model = group_keys("model")
        return model["n_enc_layers"], model["n_dec_layers"], task_spec(group_keys("data")["task"])
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
        titles = ", ".join(getattr(p, "title", None) or "?" for p in section.panels)  # a markdown panel has none
        lines.append(f"  {section.name} ({len(section.panels)}): {titles}")
    return "\n".join(lines)
