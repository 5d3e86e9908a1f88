"""The pieces a checkpoint carries (training/state.py), each registered once in ``Run.pieces``: every piece
round-trips through save and load, a checkpoint lacking one is named, and what older checkpoints lack is filled in
by one migration (runlog/migrate.py), with which an oldest-format checkpoint resumes exactly."""

import json
from pathlib import Path

import pytest
import torch

import train as train_module
from runlog.migrate import migrate_checkpoint
from tests.helpers.config import make_cfg
from tests.helpers.resume import EXACT, losses, stop_by_sigterm
from training.checkpoint import FORMAT, load_checkpoint
from training.run import Run, start_run
from training.schema import validate
from training.state import load_state, save_state

PIECES = ["model", "optimizer", "rng", "step", "data_position", "counters", "spikes", "telemetry", "best"]


def same(a: object, b: object) -> bool:
    """Whether two saved states are equal, tensors compared bit for bit (nested dicts, lists and tuples)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def fresh_run(run_dir: Path) -> Run:
    run_dir.mkdir()  # as train() makes it
    return start_run(validate(make_cfg("trainer.test_checkpoint=best")), run_dir, is_main=True)


def trained(run: Run) -> Run:
    """``run`` with every piece moved off its fresh state, as seven steps would move it."""
    for p in run.model.parameters():
        p.grad = torch.full_like(p, 0.5)
    run.opt.step()  # the weights and AdamW's moments
    torch.rand(3)  # the torch stream
    run.step, run.data_position, run.counters = 7, (1, 3), {"wall_s": 2.5, "tgt_tokens": 900}
    run.spikes.add([1.0, 2.0, float("nan")], [0.5, 0.5, 0.5])
    run.telemetry.parameters.record()  # the power-iteration vectors
    assert run.best is not None
    run.best.step, run.best.value = 5, 0.3
    return run


def test_every_registered_piece_round_trips_through_save_and_load(tmp_path):
    saved = save_state(trained(fresh_run(tmp_path / "a")).pieces())
    assert list(saved) == PIECES  # the registry: one entry per piece, each once
    other = fresh_run(tmp_path / "b")  # built with the same seed: only the trained state differs
    fresh = save_state(other.pieces())
    assert [k for k in PIECES if same(fresh[k], saved[k])] == []  # so each round trip below shows
    load_state(other.pieces(), saved, tmp_path / "a")
    again = save_state(other.pieces())
    assert [k for k in PIECES if not same(again[k], saved[k])] == []
    assert other.step == 7 and other.data_position == (1, 3) and other.spikes.status()["spike_score_loss"] == 1 / 3
    assert len(again["telemetry"]["power"]) == 2 * 6 + 2 * 10 and other.best and other.best.value == 0.3


def test_a_checkpoint_lacking_a_piece_is_named_and_an_old_one_starts_those_pieces_afresh(tmp_path):
    run = trained(fresh_run(tmp_path / "a"))
    saved = save_state(run.pieces())
    other = fresh_run(tmp_path / "b")
    with pytest.raises(ValueError, match=r"b/checkpoint.pt lacks the checkpoint entries \['counters'\]: it was not"):
        load_state(other.pieces(), {k: v for k, v in saved.items() if k != "counters"}, tmp_path / "b" / "checkpoint.pt")

    old = {k: v for k, v in saved.items() if k not in ("spikes", "telemetry", "best")}  # as the oldest format wrote it
    old |= {"config": {"trainer": {"eval_max_words": 7}}, "rng": saved["rng"][0]}
    migrated = migrate_checkpoint(old)
    assert [migrated[k] for k in ("spikes", "telemetry", "best", "task")] == [None, None, None, "g2p"]
    assert migrated["config"]["trainer"] == {"eval_max_examples": 7} and same(migrated["rng"], saved["rng"])
    assert "task" not in old and isinstance(old["rng"], dict)  # the input is left as it was
    load_state(other.pieces(), migrated, tmp_path / "a")
    assert other.step == 7 and other.spikes.status() == {"spike_score_loss": 0.0, "spike_score_grad_norm": 0.0}
    assert other.telemetry.state_dict() == {"power": {}} and other.best and other.best.step is None


def test_a_checkpoint_of_the_oldest_format_resumes_exactly(tmp_path, monkeypatch, capsys):
    train_module.train(make_cfg(*EXACT), tmp_path / "straight")
    stop_by_sigterm(monkeypatch, make_cfg(*EXACT), tmp_path / "old", 5)
    path = tmp_path / "old" / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=False)
    for key in ("spikes", "telemetry", "best", "task"):  # written before each existed
        del ckpt[key]
    ckpt["rng"] = ckpt["rng"][0]  # one process's streams, before each rank kept its own
    ckpt["config"]["trainer"]["eval_max_words"] = ckpt["config"]["trainer"].pop("eval_max_examples")
    torch.save({**ckpt, "format": FORMAT}, path)
    Path(f"{path}.sha256").unlink()
    capsys.readouterr()
    train_module.train(make_cfg(*EXACT), tmp_path / "old")
    assert f"resuming from step 5 (checkpoint {path})\n" in capsys.readouterr().out  # no setting reported changed
    assert losses(tmp_path / "old") == losses(tmp_path / "straight")  # loss and lr of all 12 steps, bit for bit
    resumed = load_checkpoint(path)
    assert resumed["step"] == 12 and resumed["task"] == "g2p" and len(resumed["rng"]) == 1
    assert resumed["spikes"]["loss"]["steps"] == 7  # the scores start afresh: the 7 steps after the checkpoint
    assert json.loads((tmp_path / "old" / "status.json").read_text())["state"] == "finished"
