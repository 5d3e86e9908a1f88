"""The command line of ``train.py`` around Hydra: checks of the arguments before Hydra reads them,
the run dir check, and the commands a run prints to continue it.

``check_args`` runs before Hydra: an override that sets a renamed key, ``norm=<a norm kind>``
(the likeliest mistake: ``norm`` picks a preset, ``norm.kind`` the kind), an unknown preset or key, stop with one
line naming the nearest valid names, which Hydra's own error would not give; ``+experiment=<a sweep preset>``
without ``-m`` warns that only one run trains. :class:`RunDirCheck` (a Hydra callback) stops with one line when the
run or sweep dir cannot be created or written into, before Hydra's traceback would. :func:`resume_command` and
:func:`continue_command` quote every argument for a POSIX shell and the dir for Hydra's override
grammar, so the printed command pastes as it is.
"""

import difflib
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from model.kinds import NORM_KINDS
from model.norm_config import norm_label
from runlog.renames import renamed_override

CONF = Path(__file__).resolve().parents[1] / "conf"
MULTIRUN_FLAGS = ("-m", "--multirun")
_PLAIN = re.compile(r"[\w/.:@%+~-]+")  # a value Hydra's override grammar reads as it is (no quotes needed)


def register_resolvers() -> None:
    """Register what conf/config.yaml reads: ``${norm_kinds:}`` (its ``--help`` header), ``model.kinds.NORM_KINDS``
    comma-separated, so the help lists the kinds the records define; ``${norm_label:${norm}}`` (the run dir's name),
    ``model.norm_config.norm_label`` joined by ``-``. Call before Hydra composes the config."""
    OmegaConf.register_new_resolver("norm_kinds", lambda: ", ".join(NORM_KINDS), replace=True)
    OmegaConf.register_new_resolver("norm_label", lambda norm: "-".join(norm_label(norm)), replace=True)


def presets(group: str) -> list[str]:
    """The preset names of a config group (``conf/<group>/*.yaml``), sorted."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def hydra_error_line(error: Exception) -> str:
    """Hydra's or OmegaConf's multi-line error as one line: its message, a list of options joined by commas, and
    without the config search path and the hints (``HYDRA_FULL_ERROR``, ``full_key:``, ``object_type=``)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if "Config search path:" in lines:
        lines = lines[: lines.index("Config search path:")]
    lines = [line for line in lines if not line.startswith(("full_key:", "object_type=", "Set the environment variable"))]
    head: list[str] = []
    options: list[str] = []
    for line in lines:  # "Available options in 'norm':" then one option a line
        (options if head and head[-1].startswith("Available options") and not line.endswith(":") else head).append(line)
    text = "; ".join(line.rstrip(".") for line in head)
    return f"{text} {', '.join(options)}" if options else text


def norm_kind_as_preset(args: list[str]) -> str | None:
    """The error for ``norm=<kind>`` (a norm kind given where a preset is expected), else None."""
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "norm" and value in NORM_KINDS and value not in presets("norm"):
            return (
                f"norm={value} is not a preset; did you mean norm.kind={value} (the norm kind, on the default "
                f"placement) or a preset such as norm=pre_ln? presets: {', '.join(presets('norm'))}"
            )
    return None


def sweep_preset_warning(args: list[str]) -> str | None:
    """The warning for ``+experiment=<name>`` of a sweep preset (one with ``hydra.sweeper.params``) without
    ``-m``: only its base config trains. None with ``-m``, and with ``hydra.run.dir=`` (one job of the
    sweep, e.g. a printed resume command)."""
    if any(a in MULTIRUN_FLAGS or a.startswith("hydra.run.dir=") for a in args):
        return None
    for arg in args:
        key, _, name = arg.lstrip("+").partition("=")
        path = CONF / "experiment" / f"{name}.yaml"
        if key == "experiment" and path.is_file() and OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params"):
            return (
                f"+experiment={name} is a sweep preset; without -m only one run (its base config) trains: add -m to run the sweep"
            )
    return None


def unknown_preset(args: list[str]) -> str | None:
    """The error for ``group=name`` naming no preset of a config group (``norm=pre_lm``), with the nearest names;
    else None. Hydra's own error spans 40 lines and suggests nothing."""
    for group, names in _choices(args):
        for name in names:
            if name not in (valid := presets(group)):
                near = difflib.get_close_matches(name, valid, n=3)
                hint = f"did you mean {' or '.join(f'{group}={n}' for n in near)}? " if near else ""
                return f"unknown {group} preset {name!r}; {hint}valid: {', '.join(valid)}"
    return None


def _choices(args: list[str]) -> list[tuple[str, list[str]]]:
    """(group, the presets it names) of each ``group=name`` / ``+group=a,b`` override of a conf/ group; a sweep
    written with Hydra's functions (``choice(...)``, ``glob(...)``) is left to Hydra."""
    out = []
    for arg in args:
        group, _, value = arg.lstrip("+").partition("=")
        # hydra/*: Hydra's and its plugins' own presets (hydra/launcher=joblib) sit outside conf/
        if (CONF / group).is_dir() and not group.startswith("hydra") and value and "(" not in value:
            out.append((group, value.split(",")))
    return out


def unknown_key(args: list[str]) -> str | None:
    """The error for ``a.b=value`` setting a key the composed config lacks (``model.d_modle=64``), with the nearest
    keys of its section; else None. Hydra's own error suggests ``+model.d_modle=64``, which adds the typo as a key (and
    the run then stops on it). The config is composed with ``args``' preset choices, so a preset's own keys count."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    # The first preset of each group's choice (of a sweep's, too), the experiment's included: the keys they bring count.
    choices = [("+" if g == "experiment" else "") + f"{g}={names[0]}" for g, names in _choices(args)]
    keys = [a.split("=", 1)[0] for a in args if "=" in a and a[0] not in "+~" and "." in a.split("=", 1)[0]]
    keys = [k for k in keys if not k.startswith("hydra.")]
    if not keys:
        return None
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=choices)
    except HydraException:  # a bad choice: Hydra says so when it reads them
        return None
    for key in keys:
        section, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, section)
        if isinstance(node, DictConfig) and leaf not in node:
            near = difflib.get_close_matches(leaf, [str(k) for k in node], n=3)
            hint = f"did you mean {' or '.join(f'{section}.{n}' for n in near)}? " if near else ""
            return f"{key} is not a key of {section}; {hint}valid keys: {', '.join(str(k) for k in node)}"
    return None


def override_error(args: list[str]) -> str | None:
    """What is wrong with ``args`` before Hydra reads them, in one line: a renamed key (``runlog.renames``),
    ``norm=<a kind>`` (:func:`norm_kind_as_preset`), an unknown preset or key (:func:`unknown_preset`,
    :func:`unknown_key`); None when none. train.py and the scripts that compose its configs (``match_params``,
    ``estimate_time``) refuse the same overrides."""
    return renamed_override(args) or norm_kind_as_preset(args) or unknown_preset(args) or unknown_key(args)


def check_args(args: list[str]) -> None:
    """Exit with one line for a renamed key or ``norm=<kind>``; print a warning for a sweep preset
    without ``-m`` (module docstring). Run before Hydra reads ``args``."""
    if error := override_error(args):
        sys.exit(f"normlab: error: {error}")
    if warning := sweep_preset_warning(args):
        print(f"normlab: warning: {warning}", file=sys.stderr)


class RunDirCheck(Callback):
    """Creates the run dir (the sweep dir of a multirun) before Hydra does, so that one that cannot be
    created (``/proc/x``, a path under a file, a read-only parent) or written into (a read-only dir) stops
    with one line naming it and why."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _create(config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _create(config.hydra.sweep.dir)


def _create(run_dir: str) -> None:
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        sys.exit(f"normlab: error: cannot create run dir '{run_dir}': {e.strerror or e}")
    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 writes into the run dir
        return
    try:  # a real write: os.access would pass a read-only mount, and pass everything as root
        tempfile.TemporaryFile(dir=run_dir).close()
    except OSError as e:
        sys.exit(
            f"normlab: error: cannot write into run dir '{run_dir}': {e.strerror or e}; make it writable "
            "or give another hydra.run.dir"
        )


def hydra_quoted(value: str) -> str:
    """``value`` as an override value Hydra reads back unchanged: as it is when plain, else single-quoted."""
    if _PLAIN.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def shell_quoted(arg: str) -> str:
    """``arg`` as one word of a POSIX shell; one holding Hydra's quotes in double quotes, where that is enough
    (``"hydra.run.dir='a=b,c'"`` reads better than shlex's ``'hydra.run.dir='"'"'a=b,c'"'"''``)."""
    if "'" in arg and not set('"$`\\!') & set(arg):
        return f'"{arg}"'
    return shlex.quote(arg)


def command(overrides: list[str], dir_key: str, run_dir: str | Path, drop: tuple[str, ...] = ()) -> str:
    """``python train.py [-m] <overrides> <dir_key>=<run_dir>`` for a POSIX shell (``-m`` for a sweep dir);
    overrides that set ``dir_key``, ``hydra.mode`` or start with one of ``drop`` are left out."""
    multirun = ["-m"] if dir_key == "hydra.sweep.dir" else []
    kept = [o for o in overrides if not o.startswith((f"{dir_key}=", "hydra.mode=", *drop))]
    args = [*kept, f"{dir_key}={hydra_quoted(str(run_dir))}"]
    return " ".join(["python train.py", *multirun, *map(shell_quoted, args)])


def continue_command(hydra: DictConfig, sweep_dir: str | Path) -> str:
    """The command line that continues a sweep from the ``hydra`` node of its multirun config (its
    overrides, then Hydra's, pointed at ``sweep_dir``); a sweep re-run skips finished jobs, resumes the rest."""
    return command([*hydra.overrides.task, *hydra.overrides.hydra], "hydra.sweep.dir", sweep_dir)


def resume_command(run_dir: Path) -> str:
    """The command line that continues this run (its Hydra overrides, pointed at its run dir); for a job of
    a sweep also the one that continues the whole sweep."""
    if not HydraConfig.initialized():
        return command([], "hydra.run.dir", run_dir)
    hc = HydraConfig.get()
    sweep = ("hydra.sweep.", "hydra/launcher=", "hydra.launcher.")  # a single run has no sweep and no launcher
    job = command([*hc.overrides.task, *hc.overrides.hydra], "hydra.run.dir", run_dir, drop=("train.resume=", *sweep))
    multirun = Path(hc.sweep.dir) / "multirun.yaml"  # the sweep's config, written by Hydra's sweeper
    if hc.mode != RunMode.MULTIRUN or not multirun.is_file():
        return job
    return f"{job}; the whole sweep: {continue_command(OmegaConf.load(multirun).hydra, hc.sweep.dir)}"
