"""trainer.test_checkpoint=best (training/best.py): the final test scores the weights of the best validation PER
(best.pt), not the last step's; the default (last) writes no best.pt; resume keeps the best so far; a stale best.pt
never reaches the test."""

import json
from pathlib import Path

import pytest
import torch

import train as train_module
from runlog.tasks import TASKS
from tests.helpers.config import make_cfg
from training.best import BEST, BestCheckpoint
from training.checkpoint import load_checkpoint, model_from
from training.schema import validate
from training.tasks.g2p import G2PTask

BEST_RUN = ["trainer.test_checkpoint=best", "trainer.eval_every=5"]  # validations at 5, 10, 15, 20


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_lower_is_better_for_per_higher_for_bleu_and_ties_keep_the_earlier(tmp_path):
    per = BestCheckpoint(TASKS["g2p"].metric("per"))
    weights = {"config": {}, "model": {"w": torch.zeros(1)}}
    assert per.consider(tmp_path, 5, {"per": 0.5}, weights) and per.record() == {"metric": "val/per", "value": 0.5, "step": 5}
    assert not per.consider(tmp_path, 10, {"per": 0.5}, weights)  # a tie
    assert per.consider(tmp_path, 15, {"per": 0.4}, weights) and not per.consider(tmp_path, 20, {"per": 0.6}, weights)
    assert load_checkpoint(tmp_path / BEST)["step"] == 15 == per.step
    bleu = BestCheckpoint(TASKS["translation"].metric("bleu"))
    assert bleu.beats(1.0) and bleu.consider(tmp_path, 5, {"bleu": 10.0}, weights) and bleu.beats(12.0) and not bleu.beats(9.0)


def test_a_stale_or_missing_best_checkpoint_is_an_error(tmp_path):
    best = BestCheckpoint(TASKS["g2p"].metric("per"))
    with pytest.raises(FileNotFoundError, match="no validation ran"):
        best.weights(tmp_path)
    best.consider(tmp_path, 5, {"per": 0.5}, {"config": {}, "model": {}})
    best.load_state_dict({"metric": "val/per", "value": 0.4, "step": 10})  # a checkpoint says step 10; the file is step 5's
    with pytest.raises(ValueError, match="is of step 5, but this run's best is step 10"):
        best.weights(tmp_path)


def test_the_default_tests_the_last_weights_and_writes_no_best_checkpoint(tmp_path):
    assert validate(make_cfg()).trainer.test_checkpoint == "last"
    train_module.train(make_cfg(), tmp_path)
    status = json.loads((tmp_path / "status.json").read_text())
    assert not (tmp_path / BEST).exists() and "best" not in status
    assert load_checkpoint(tmp_path / "checkpoint.pt")["best"] is None


def test_best_tests_the_weights_of_the_best_validation_per(tmp_path, capsys, monkeypatch):
    # At this size every validation PER is ~100 %, so the validations are scripted (step 10 best, a tie at 20) and
    # the test's own evaluation is watched: it must see step 10's weights, which checkpoint.prev.pt also holds.
    scripted, tested = iter([0.5, 0.3, 0.4, 0.3]), []
    evaluate = G2PTask.evaluate

    def watched(self, model, split, max_examples, device):
        if split == "valid":
            return {"per": next(scripted), "wer": 0.9}
        tested.append({k: v.clone() for k, v in model.state_dict().items()})
        return evaluate(self, model, split, max_examples, device)

    monkeypatch.setattr(G2PTask, "evaluate", watched)
    test = train_module.train(make_cfg(*BEST_RUN), tmp_path)
    assert [r["val/per"] for r in rows(tmp_path) if "val/per" in r] == [0.5, 0.3, 0.4, 0.3]
    saved, step_10 = load_checkpoint(tmp_path / BEST), load_checkpoint(tmp_path / "checkpoint.prev.pt")
    assert saved["step"] == step_10["step"] == 10 and saved["best"] == {"metric": "val/per", "value": 0.3, "step": 10}
    (weights,) = tested
    assert all(torch.equal(weights[k], saved["model"][k]) and torch.equal(weights[k], step_10["model"][k]) for k in weights)
    last = load_checkpoint(tmp_path / "checkpoint.pt")
    assert last["step"] == 20 and not all(torch.equal(last["model"][k], weights[k]) for k in weights)
    assert last["best"] == saved["best"]  # a resume continues from it
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["best"] == saved["best"] and status["test"] == test and status["step"] == 20
    assert "testing the best validation checkpoint: step 10, PER 30.00%" in capsys.readouterr().out
    assert model_from(saved).state_dict().keys() == weights.keys()  # predict.py reads best.pt


def test_a_fresh_start_drops_an_earlier_runs_best_and_best_pt_does_not_resume(tmp_path):
    train_module.train(make_cfg(*BEST_RUN), tmp_path)
    with pytest.raises(ValueError, match=r"holds weights only \(best.pt"):
        train_module.train(make_cfg(*BEST_RUN, f"train.resume={tmp_path / BEST}"), tmp_path / "other")
    (tmp_path / "checkpoint.pt").unlink()
    (tmp_path / "checkpoint.prev.pt").unlink()
    (tmp_path / "status.json").unlink()  # a fresh start in the same dir
    train_module.train(make_cfg("trainer.max_steps=4", "trainer.test_checkpoint=best", "trainer.eval_every=2"), tmp_path)
    assert load_checkpoint(tmp_path / BEST)["step"] in (2, 4)


def test_an_unknown_test_checkpoint_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"trainer.test_checkpoint='average' is invalid; valid: last, best"):
        validate(make_cfg("trainer.test_checkpoint=average"))
