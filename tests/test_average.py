"""trainer.average_last (training/average.py): the final test scores the mean of the weights at the last k checkpoint
steps, kept as snapshots that survive a stop and a resume; fewer than k: the average of those there are, said so;
a config that sets it with test_checkpoint=best, or below 2, is refused."""

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import torch

import train as train_module
from tests.helpers.config import make_cfg
from tests.helpers.resume import EXACT, stop_by_sigterm
from training.average import AVERAGED, LastCheckpoints, average_state_dicts, snapshot_path, snapshots
from training.checkpoint import load_checkpoint, model_from
from training.schema import validate
from training.tasks.g2p import G2PTask

# Checkpoints due at 2, 4, ..., 12; the last 3 (8, 10, 12) are averaged.
AVERAGE = [*EXACT, "trainer.checkpoint_every=2", "trainer.average_last=3", "trainer.test_max_examples=20"]


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, torch.Tensor]], str]:
    """A straight run of ``AVERAGE``: (its run dir, the weights its final test scored, what it printed)."""
    run_dir, tested, evaluate = tmp_path_factory.mktemp("straight"), [], G2PTask.evaluate

    def watched(self, model, split, max_examples, device):
        if split == "test":
            tested.append({k: v.clone() for k, v in model.state_dict().items()})
        return evaluate(self, model, split, max_examples, device)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as out:
        patch.setattr(G2PTask, "evaluate", watched)
        train_module.train(make_cfg(*AVERAGE), run_dir)
    return run_dir, tested, out.getvalue()


def test_the_mean_of_floats_and_the_floor_of_the_mean_of_integers_as_fairseq():
    states = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}, {"w": torch.tensor([2.0, 4.0]), "n": torch.tensor(4)}]
    mean = average_state_dicts(states)
    assert torch.equal(mean["w"], torch.tensor([1.5, 3.0])) and mean["n"].dtype == torch.long and mean["n"].item() == 3
    with pytest.raises(ValueError, match="different entries"):
        average_state_dicts([{"w": torch.zeros(1)}, {"v": torch.zeros(1)}])


def test_the_averaged_steps_are_the_last_k_checkpoint_steps():
    last = LastCheckpoints(k=3, every=10, max_steps=25)
    assert last.steps(25) == [10, 20, 25] and last.steps(24) == [10, 20] and last.steps(9) == []
    assert LastCheckpoints(k=2, every=5, max_steps=20).steps(20) == [15, 20]  # the last step is a multiple: once


def test_snapshots_kept_pruned_and_averaged_on_disk(tmp_path):
    last = LastCheckpoints(k=3, every=10, max_steps=35)
    for step in (10, 15, 20, 30):  # 15: a signal's checkpoint, between checkpoint steps: no snapshot
        last.save(tmp_path, step, {"config": {}, "model": {"w": torch.full((2,), float(step))}})
    assert sorted(snapshots(tmp_path)) == [10, 20, 30]
    snapshot_path(tmp_path, 20).unlink()  # as if step 20 had been trained with trainer.average_last off
    mean, text = last.average(tmp_path, 30)
    assert torch.equal(mean["w"], torch.full((2,), 20.0))
    assert text == "average of the last 2 checkpoints, steps 10-30 (trainer.average_last=3: no snapshot of step 20)"
    last.prune(tmp_path, 10)  # a resume from step 10: the later snapshots go
    assert sorted(snapshots(tmp_path)) == [10]
    torch.save({**load_checkpoint(snapshot_path(tmp_path, 10)), "step": 20}, snapshot_path(tmp_path, 10))
    with pytest.raises(ValueError, match="snapshot_10.pt holds step 20, not 10"):
        last.average(tmp_path, 10)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no snapshot of steps \[10, 20, 30\]"):
        last.average(tmp_path / "empty", 30)


def test_the_test_scores_the_mean_of_the_last_k_snapshots(straight):
    tmp_path, tested, out = straight
    assert sorted(snapshots(tmp_path)) == [8, 10, 12]  # 2, 4 and 6 were removed as later ones came
    saved = [load_checkpoint(snapshot_path(tmp_path, s)) for s in (8, 10, 12)]
    last, previous = load_checkpoint(tmp_path / "checkpoint.pt"), load_checkpoint(tmp_path / "checkpoint.prev.pt")
    for snapshot, checkpoint in ((saved[2], last), (saved[1], previous)):  # each is its step's weights
        assert snapshot["step"] == checkpoint["step"] and "optimizer" not in snapshot
        assert all(torch.equal(snapshot["model"][k], checkpoint["model"][k]) for k in checkpoint["model"])
    (weights,) = tested
    for key, value in weights.items():
        mean = (saved[0]["model"][key] + saved[1]["model"][key] + saved[2]["model"][key]) / 3
        torch.testing.assert_close(value, mean, rtol=1e-6, atol=1e-7)
    assert not all(torch.equal(weights[k], last["model"][k]) for k in weights)  # not the last step's
    averaged = load_checkpoint(tmp_path / AVERAGED)  # what predict.py reads
    assert averaged["step"] == 12 and all(torch.equal(averaged["model"][k], weights[k]) for k in weights)
    assert model_from(averaged).state_dict().keys() == weights.keys()
    text = "average of the last 3 checkpoints, steps 8-12"
    assert averaged["average"] == status(tmp_path)["tested"] == text
    assert f"normlab: testing {text} ({tmp_path / AVERAGED})\n" in out
    assert re.search(f"^tested +{text}$", out, re.M)  # the summary's first row


def test_a_stopped_and_resumed_run_averages_the_snapshots_of_a_straight_run(straight, tmp_path, monkeypatch):
    stopped = tmp_path / "stopped"
    stop_by_sigterm(monkeypatch, make_cfg(*AVERAGE), stopped, 9)  # a signal's checkpoint at 9: no snapshot
    assert sorted(snapshots(stopped)) == [4, 6, 8]
    # What an attempt killed between its snapshot and its checkpoint leaves: a snapshot past the checkpoint's step
    # (its weights then of another attempt: here zeros), and one of a step no longer due (a changed checkpoint_every).
    for step in (10, 7):
        torch.save({**load_checkpoint(snapshot_path(stopped, 8)), "step": step, "model": {}}, snapshot_path(stopped, step))
    train_module.train(make_cfg(*AVERAGE), stopped)
    assert sorted(snapshots(stopped)) == sorted(snapshots(straight[0])) == [8, 10, 12]
    for name in (snapshot_path(stopped, 10).name, AVERAGED):
        a, b = (load_checkpoint(d / name)["model"] for d in (straight[0], stopped))
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert status(stopped)["tested"] == status(straight[0])["tested"]
    assert status(stopped)["test"] == status(straight[0])["test"]


def test_fewer_checkpoints_than_k_average_those_there_are_and_a_fresh_start_drops_them(tmp_path, capsys):
    short = ["trainer.max_steps=12", "trainer.checkpoint_every=5", "trainer.test_max_examples=20"]  # due: 5, 10, 12
    train_module.train(make_cfg(*short, "trainer.average_last=5"), tmp_path)
    text = "average of the last 3 checkpoints, steps 5-12 (trainer.average_last=5: the run has 3 checkpoint steps)"
    assert status(tmp_path)["tested"] == text and f"normlab: testing {text} ({tmp_path / AVERAGED})\n" in capsys.readouterr().out
    train_module.train(make_cfg("train.resume=null", "trainer.max_steps=4", "trainer.test_max_examples=20"), tmp_path)
    assert snapshots(tmp_path) == {} and not (tmp_path / AVERAGED).exists()  # the earlier run's, removed
    assert status(tmp_path)["tested"] == "the last step's weights"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.average_last=1"], "trainer.average_last=1 is invalid; it must be null (off) or an integer >= 2"),
        (["trainer.average_last=abc"], "trainer.average_last='abc' is invalid"),
        (["trainer.average_last=5", "trainer.test_checkpoint=best"],
         "trainer.average_last=5 and trainer.test_checkpoint=best both choose the weights the final test scores; set "
         "one: trainer.average_last=null or trainer.test_checkpoint=last"),
    ],
)  # fmt: skip
def test_bad_average_settings_are_refused_naming_the_keys(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(make_cfg(*overrides))
    assert validate(make_cfg()).trainer.average_last is None  # the default: off
