"""The committed results of docs/results.md's G2P-baseline section: each G2P recipe's report (4,000 and 5,000 steps)
holds one finished run per seed its claims file fixed, of the recipe the preset composes now; the default run's report
is one finished run of README command 1; each recipe run's wall time is its own measurement, under the page's hour;
the recipes differ where the page says; and the comparison with published systems on the same data reads the checked
CSVs."""

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from runlog.renames import with_current_names
from tests.helpers.config import compose_conf
from tests.helpers.csvs import read_csv
from tests.helpers.results import sections

ROOT = Path(__file__).parents[1]
STUDY = ROOT / "docs" / "results" / "g2p_baseline"
LONGER = ROOT / "docs" / "results" / "g2p_recipe_5k"
DEFAULT = STUDY / "default_recipe"
RECIPES = (STUDY, LONGER)  # the report folders whose seeds and claim a claims file fixed before the runs
# report folder: its command's overrides (seed 0's)
RUNS = {STUDY: ["+experiment=g2p_baseline"], LONGER: ["+experiment=g2p_recipe_5k"], DEFAULT: []}
(SECTION,) = [s for s in sections() if s.startswith("## The G2P baseline")]
HOUR = 3600.0  # the budget set for one run of the recipe on 2 quiet cores, in seconds


def config(folder: Path) -> dict:
    """The runs' committed config.yaml, read as normlab reads a saved config: with today's key names."""
    return with_current_names(yaml.safe_load((folder / "config.yaml").read_text()))


def validations(folder: Path) -> dict[str, list[dict]]:
    """Each run's validation rows of ``curves.csv``, in step order (step 0 has a loss but no decoding)."""
    rows: dict[str, list[dict]] = {}
    for row in read_csv(folder / "curves.csv"):
        if row["val/per"]:
            rows.setdefault(row["run"], []).append(row)
    return rows


def pct(fraction: str) -> str:
    """A CSV's fraction as the page writes a PER or WER: ``0.2875`` -> ``28.75 %``."""
    return f"{100 * float(fraction):.2f} %"


def flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def differing(a: Path, b: Path) -> set[str]:
    """The dotted keys whose values differ between two report folders' committed configs."""
    left, right = flat(config(a)), flat(config(b))
    return {k for k in left.keys() | right.keys() if left.get(k) != right.get(k)}


def claims(folder: Path) -> dict:
    """A recipe's claims file, fixed before its runs."""
    return yaml.safe_load((folder / "claims.yaml").read_text())


@pytest.mark.parametrize("folder", RUNS, ids=lambda f: f.name)
def test_each_report_holds_finished_runs_of_its_recipe(folder: Path) -> None:
    cfg = OmegaConf.to_container(compose_conf(*RUNS[folder]), resolve=True)
    assert config(folder) == cfg
    runs = read_csv(folder / "runs.csv")
    seeds = claims(folder)["seeds"] if folder in RECIPES else [cfg["seed"]]
    assert sorted(int(r["seed"]) for r in runs) == seeds
    assert len({r["variant"] for r in runs}) == 1
    every, steps = cfg["trainer"]["eval_every"], cfg["trainer"]["max_steps"]
    done = {run: [int(r["step"]) for r in rows] for run, rows in validations(folder).items()}
    assert done == {r["run"]: list(range(every, steps + 1, every)) for r in runs}
    for run in runs:
        assert run["state"] == "finished" and int(run["step"]) == steps
        assert 0 < float(run["test/per"]) < float(run["test/wer"]) < 1
        # the closest reference scores at most what the first one does
        assert float(run["test/per"]) <= float(run["test/per_1ref"]) and float(run["test/wer"]) <= float(run["test/wer_1ref"])


def test_the_default_runs_status_is_its_row() -> None:
    (run,) = read_csv(DEFAULT / "runs.csv")
    status = json.loads((DEFAULT / "status.json").read_text())
    assert status["state"] == "finished" and {k: float(run[k]) for k in status["test"]} == status["test"]


@pytest.mark.parametrize("study", RECIPES, ids=lambda f: f.name)
def test_each_recipe_run_took_under_an_hour_from_start_to_end(study: Path) -> None:
    """wall_time.csv: start (the run's .hydra/config.yaml written) to end (its final status.json written), which
    includes start-up, validations, checkpoints and the test that runs.csv's ``wall_s`` (the steps) leaves out."""
    runs = {r["run"]: r for r in read_csv(study / "runs.csv")}
    times = read_csv(study / "wall_time.csv")
    assert sorted(r["run"] for r in times) == sorted(runs)
    for row in times:
        start, end = (datetime.fromisoformat(row[k]) for k in ("started_utc", "ended_utc"))
        assert abs((end - start).total_seconds() - float(row["elapsed_s"])) < 1
        assert float(runs[row["run"]]["wall_s"]) < float(row["elapsed_s"]) < HOUR
        assert 0 < float(row["load_mean"]) <= float(row["load_max"])


def test_the_recipes_differ_in_the_settings_the_page_names() -> None:
    differ = differing(STUDY, DEFAULT)
    model = {"model.d_model", "model.d_ff", "model.dropout", "model.attn_dropout", "model.act_dropout"}
    recipe = model | {"norm.impl", "optim.lr", "schedule.warmup_steps", "trainer.max_steps"}
    cadence = {"trainer.eval_every", "trainer.checkpoint_every"}
    # PowerNorm's warmup follows the schedule's by default (unused here: LayerNorm); the logger does not train
    assert {k for k in differ if not k.startswith("logger.")} == recipe | cadence | {"norm.knobs.powernorm.warmup_iters"}
    for key in sorted(recipe):
        assert f"`{key}`" in SECTION, key  # the set-up table names each


def test_the_longer_recipe_differs_in_its_steps_only() -> None:
    """The page: against the 4,000-step recipe, g2p_recipe_5k changes the steps and the warmup, a tenth of them."""
    # the committed configs are the presets as they compose now (test_each_report_holds_finished_runs_of_its_recipe);
    # PowerNorm's warmup follows the schedule's by default (unused here: LayerNorm)
    differ = differing(*RECIPES)
    assert differ == {"trainer.max_steps", "schedule.warmup_steps", "norm.knobs.powernorm.warmup_iters"}
    base, longer = (flat(config(f)) for f in RECIPES)
    for cfg in (base, longer):
        assert cfg["schedule.warmup_steps"] * 10 == cfg["trainer.max_steps"]
    assert (base["trainer.max_steps"], longer["trainer.max_steps"]) == (4000, 5000)


@pytest.mark.parametrize("study", RECIPES, ids=lambda f: f.name)
def test_the_comparison_reads_the_same_data_systems_and_the_recipes_mean(study: Path) -> None:
    published = {r["quantity"]: float(r["value"]) for r in read_csv(ROOT / "docs" / "results" / "published.csv")}
    same_data = {q: v for q, v in published.items() if "CMUdict latest" in q}
    assert len(same_data) == 2
    (claim,) = claims(study)["claims"]
    assert claim["against"] == min(same_data.values())  # the bar is the best published system on the same data
    assert claim["csv"] == f"{study.name}/runs.csv"
    summary = {(r["variant"], r["metric"]): r for r in read_csv(study / "summary.csv")}
    (variant,) = {v for v, _ in summary}
    assert claim["arm"] == {"variant": variant}
    runs = read_csv(study / "runs.csv")
    for metric in ("test/per", "test/wer", "test/per_1ref", "test/wer_1ref"):
        mean = sum(float(r[metric]) for r in runs) / len(runs)
        assert abs(float(summary[variant, metric]["mean"]) - mean) < 1e-12, metric


@pytest.mark.parametrize("study", RECIPES, ids=lambda f: f.name)
def test_every_recipe_runs_validation_loss_fell_at_every_validation(study: Path) -> None:
    """The page: "Every run's validation loss still fell at its last validation"; it fell at every one."""
    losses = {run: [float(r["val/loss"]) for r in rows] for run, rows in validations(study).items()}
    assert len(losses) == 3
    for run, loss in losses.items():
        assert all(b < a for a, b in zip(loss, loss[1:], strict=False)), run


def test_every_longer_run_is_below_every_shorter_run_and_its_steps_were_faster() -> None:
    """The page: all three runs at 5,000 steps are below all three at 4,000 (test WER), and their steps were faster;
    seeds 0 and 1 tie on test WER and 1-ref WER but are different runs (their PERs and losses differ)."""
    base, longer = (read_csv(f / "runs.csv") for f in RECIPES)
    assert max(float(r["test/wer"]) for r in longer) < min(float(r["test/wer"]) for r in base)
    per_step = [[float(r["wall_s"]) / int(r["step"]) for r in runs] for runs in (base, longer)]
    assert max(per_step[1]) < min(per_step[0])
    tied = {r["seed"]: r for r in longer}
    assert tied["0"]["test/wer"] == tied["1"]["test/wer"] and tied["0"]["test/wer_1ref"] == tied["1"]["test/wer_1ref"]
    for metric in ("test/per", "test/per_1ref", "best_val_loss"):
        assert tied["0"][metric] != tied["1"][metric], metric


def test_the_longer_recipes_reading_states_its_own_numbers() -> None:
    """The subsection's reading quotes its own CSVs (the page-wide number check would accept the 4,000-step recipe's
    values, which share the section): the mean test WER with its stderr, the seeds' range, PER and 1-ref WER, and the
    4,000-step runs' range it is compared with."""
    reading = SECTION.split("### The recipe at 5,000 steps")[1].split("**Reading.**")[1].split("<!--")[0]
    reading = " ".join(reading.split())
    mean = {r["metric"]: r for r in read_csv(LONGER / "summary.csv")}
    wer = mean["test/wer"]
    assert f"mean test WER of {pct(wer['mean'])} (standard error {100 * float(wer['stderr']):.2f} points" in reading
    assert f"its PER {pct(mean['test/per']['mean'])}" in reading
    assert f"first pronunciation only, the mean is {pct(mean['test/wer_1ref']['mean'])}" in reading
    for folder, quote in ((LONGER, "the seeds {} to {}"), (LONGER, "at 5,000 steps ({} to {})"), (STUDY, "at 4,000 ({} to {})")):
        wers = sorted(float(r["test/wer"]) for r in read_csv(folder / "runs.csv"))
        assert quote.format(pct(wers[0]), pct(wers[-1])) in reading, quote
