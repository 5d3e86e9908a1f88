"""The committed results of docs/results.md's G2P-baseline section: each report is one finished run of the recipe the
page names (its committed config.yaml is the preset's, composed now), and what the prose says of the runs holds."""

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.test_lrs import read_csv

ROOT = Path(__file__).parents[1]
STUDY = ROOT / "docs" / "results" / "g2p_baseline"
RUNS = {  # report folder: the overrides of the command that made the run (README command 1 is plain `python train.py`)
    STUDY: ["+experiment=g2p_baseline", "logger=none"],
    STUDY / "default_recipe": [],
}


def composed(overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)


def curve(folder: Path) -> dict[int, dict]:
    """The run's validation rows of ``curves.csv`` by step."""
    return {int(r["step"]): r for r in read_csv(folder / "curves.csv") if r["val/per"]}


@pytest.mark.parametrize("folder", RUNS, ids=lambda f: f.name)
def test_each_report_is_one_finished_run_of_its_recipe(folder: Path) -> None:
    config = composed(RUNS[folder])
    assert yaml.safe_load((folder / "config.yaml").read_text()) == config
    (run,) = read_csv(folder / "runs.csv")
    assert run["state"] == "finished" and int(run["step"]) == config["trainer"]["max_steps"]
    assert 0 < float(run["test/per"]) < float(run["test/wer"]) < 1
    every = config["trainer"]["eval_every"]
    assert sorted(curve(folder)) == list(range(every, config["trainer"]["max_steps"] + 1, every))


def test_the_baseline_was_tested_with_the_best_validation_per_weights_of_step_4750() -> None:
    per = {step: float(r["val/per"]) for step, r in curve(STUDY).items()}
    assert min(per, key=per.get) == 4750  # the page's "best validation PER at step 4750"; ties keep the first


def test_what_the_page_says_of_the_two_runs_holds() -> None:
    (baseline,), (default,) = (read_csv(f / "runs.csv") for f in RUNS)
    for metric in ("test/per", "test/wer", "best_val_loss"):
        assert float(baseline[metric]) < float(default[metric]), metric  # "lower than the default recipe's"
    loss = [float(r["val/loss"]) for step, r in sorted(curve(STUDY).items()) if step >= 2500]
    assert all(b < a for a, b in zip(loss, loss[1:], strict=False))  # "fell at every validation from step 2500"
    published = {(r["source"], r["quantity"].rsplit(": ", 1)[1]): float(r["value"])
                 for r in read_csv(ROOT / "docs" / "results" / "published.csv") if "CMUdict" in r["quantity"]}  # fmt: skip
    for (_, metric), value in published.items():  # "behind both published systems on both metrics"
        assert float(baseline[f"test/{metric.split()[0].lower()}"]) > value
