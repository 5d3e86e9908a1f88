"""Each task's metric spec, as plain data: the metrics a run of it logs (``val/<key>``, ``test/<key>``),
how a reader shows them, and the one it leads with; and ``task.json``, the copy a run dir holds.

``TASKS`` names every task; a data preset selects one with its ``task:`` key (``conf/data/*.yaml``),
and ``training/tasks/<name>.py`` implements it. train.py writes the spec into the run dir as
``task.json`` (:func:`write_task`), so every reader (the report, the wandb workspace, predict.py)
takes the run's metrics from the run itself (:func:`read_task`). Run dirs written before task.json
fall back there, and only there, to the inference the readers made before it.
"""

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from runlog.atomic import atomic_write

TASK_FILE = "task.json"
INPUT_CASES = (None, "lower", "upper")


@dataclass(frozen=True)
class MetricSpec:
    """One decoding metric of a task.

    Attributes:
        key: logged as ``val/<key>`` and ``test/<key>`` (``per``).
        label: its name on a page or a printed line (``PER``).
        scale: shown value = stored value * scale (100: a fraction shown in percent).
        unit: the unit of the shown value (``%``), or empty.
        higher_is_better: the direction of improvement (PER: lower; BLEU: higher).
        digits: decimals shown.
    """

    key: str
    label: str
    scale: float = 1.0
    unit: str = ""
    higher_is_better: bool = False
    digits: int = 2

    @property
    def header(self) -> str:
        """The column or axis name: ``PER (%)``, ``BLEU``."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def shown(self, value: float) -> str:
        """``31.20%``, ``13.25``: a stored value as shown."""
        return f"{value * self.scale:.{self.digits}f}{self.unit}"

    def text(self, value: float) -> str:
        """``PER 31.20%``, ``BLEU 13.25``: the label and a stored value as shown."""
        return f"{self.label} {self.shown(value)}"


@dataclass(frozen=True)
class TaskSpec:
    """What a task's runs log and how readers show it.

    Attributes:
        name: the ``data.task`` value (``g2p``); ``training/tasks/<name>.py`` implements it.
        metrics: its decoding metrics, in display order.
        headline: the key of the metric the report's validation chart and the wandb workspace lead with.
        data_config: ``module:Class`` of the torch-free dataclass that types and checks the ``data`` keys of
            its presets (``training/schema.py`` imports it by this name, so a bad key is reported before torch loads).
        input_case: how predict.py reads an input line: ``lower`` or ``upper`` (stripped, then that case,
            as the training data is written), None (as given).

    Raises:
        ValueError: a headline that is none of the metrics, an unknown input_case.
    """

    name: str
    metrics: tuple[MetricSpec, ...]
    headline: str
    data_config: str
    input_case: str | None = None

    def __post_init__(self) -> None:
        if self.headline not in [m.key for m in self.metrics]:
            raise ValueError(f"task {self.name!r}: headline {self.headline!r} is none of its metrics")
        if self.input_case not in INPUT_CASES:
            raise ValueError(f"task {self.name!r}: input_case={self.input_case!r} is invalid; valid: {INPUT_CASES}")

    def metric(self, key: str) -> MetricSpec:
        """The metric logged as ``val/<key>``; KeyError for one the task does not log."""
        return {m.key: m for m in self.metrics}[key]

    def describe(self, values: dict[str, float], prefix: str = "") -> str:
        """``PER 31.20%, WER 80.50%``: each metric of ``values`` (keyed ``<prefix><key>``), in the task's order."""
        return ", ".join(m.text(values[prefix + m.key]) for m in self.metrics if prefix + m.key in values)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> "TaskSpec":
        """The spec of a parsed ``task.json``. Raises TypeError / ValueError / KeyError on a malformed one."""
        return cls(**{**d, "metrics": tuple(MetricSpec(**m) for m in d["metrics"])})


TASKS = {
    spec.name: spec
    for spec in (
        # CMUdict grapheme-to-phoneme: phoneme and word error rates against the closest reference, then against the
        # first (primary) reference alone (data.metrics)
        TaskSpec(
            "g2p",
            (
                # fractions, shown in percent
                MetricSpec("per", "PER", scale=100.0, unit="%"),
                MetricSpec("wer", "WER", scale=100.0, unit="%"),
                MetricSpec("per_1ref", "1-ref PER", scale=100.0, unit="%"),
                MetricSpec("wer_1ref", "1-ref WER", scale=100.0, unit="%"),
            ),
            "per",
            "data.config:CmudictDataConfig",
            "lower",
        ),
        # sacreBLEU corpus BLEU and chrF of the detokenized text (0-100)
        TaskSpec(
            "translation",
            (MetricSpec("bleu", "BLEU", higher_is_better=True), MetricSpec("chrf", "chrF", higher_is_better=True)),
            "bleu",
            "data.config:TranslationDataConfig",
        ),
    )
}


def task_spec(name: object) -> TaskSpec:
    """The spec of the task called ``name`` (a ``data.task`` value).

    Raises:
        ValueError: no such task; the message names the value and the valid ones.
    """
    if not isinstance(name, str) or name not in TASKS:
        raise ValueError(f"data.task={name!r} is invalid; valid: {', '.join(TASKS)} (set by the data preset, conf/data/)")
    return TASKS[name]


def write_task(run_dir: Path, spec: TaskSpec) -> None:
    """Write ``spec`` to ``run_dir/task.json`` atomically."""
    atomic_write(run_dir / TASK_FILE, lambda f: f.write(spec.to_json().encode()))


def read_task(run_dir: Path, named: str | None = None, logged: Iterable[str] | None = None) -> TaskSpec:
    """The spec of the run in ``run_dir``: its ``task.json``.

    A run dir written before task.json existed falls back here, and nowhere else, to what readers inferred
    before it: the task ``named`` (a checkpoint's ``task`` entry, which predict.py reads), else ``translation``
    when the run logged a BLEU (``val/bleu`` or ``test/bleu``), else ``g2p``.

    Args:
        logged: the metric names the run logged, when the caller has read them; None: read from the run dir's
            metrics.jsonl and status.json.

    Raises:
        ValueError: task.json exists but is not a spec (the message names the file).
    """
    path = run_dir / TASK_FILE
    if path.is_file():
        try:
            return TaskSpec.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path} is not a task spec ({type(e).__name__}: {e})") from e
    if named in TASKS:
        return TASKS[named]
    names = _logged_names(run_dir) if logged is None else set(logged)
    return TASKS["translation" if {"val/bleu", "test/bleu"} & names else "g2p"]


def _logged_names(run_dir: Path) -> set[str]:
    """Every metric name in ``run_dir``'s metrics.jsonl and status.json's test metrics (unparsable lines skipped)."""
    names: set[str] = set()
    if (metrics := run_dir / "metrics.jsonl").is_file():
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            names.update(row if isinstance(row, dict) else ())
    if (status := run_dir / "status.json").is_file():
        try:
            test = json.loads(status.read_text(encoding="utf-8")).get("test")
        except (ValueError, AttributeError):
            test = None
        names.update(test if isinstance(test, dict) else ())
    return names
