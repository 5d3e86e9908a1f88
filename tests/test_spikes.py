"""The spike score (OLMo 2, arXiv 2501.00656) on hand-made series, and a run feeding it every step."""

import json
import math

import pytest
import torch

import train as train_module
from tests.helpers.config import make_cfg
from training.checkpoint import load_checkpoint
from training.spikes import SpikeScore
from training.step import StepResult


def steady(n: int, low: float = 1.0, high: float = 3.0) -> list[float]:
    """low, high, low, ...: over an even count, mean (low + high) / 2 and std (high - low) / 2, exactly."""
    return [low if i % 2 == 0 else high for i in range(n)]


def scored(values: list[float], **settings) -> SpikeScore:
    score = SpikeScore(**settings)
    score.add(values)
    return score


def test_a_10_sigma_jump_in_a_steady_series_is_one_spike_of_all_steps():
    values = [*steady(200), 2.0 + 10 * 1.0, *steady(50)]  # 200 values of mean 2, std 1 before the jump
    score = scored(values)
    assert score.spikes == 1 and score.steps == 251
    assert score.score == 1 / 251


@pytest.mark.parametrize(("jump", "spikes"), [(6.99, 0), (7.0, 1), (-10.0, 0)])
def test_at_least_7_sigma_above_the_mean_is_a_spike_and_nothing_below_or_under_it(jump, spikes):
    assert scored([*steady(200), 2.0 + jump]).spikes == spikes  # "at least seven"; a drop is no spike


def test_steps_with_fewer_than_100_values_before_them_count_but_are_never_spikes():
    early = scored([*steady(99), 12.0])  # 99 values before the jump: not scored
    assert (early.spikes, early.steps, early.score) == (0, 100, 0.0)
    first = scored([*steady(100), 12.0])  # the first scored step, over the 100 values before it
    assert (first.spikes, first.score) == (1, 1 / 101)


def test_the_mean_and_std_are_over_the_last_1000_values_only():
    # 500 wide values (mean 10, std 10), then 1000 narrow ones (mean 10, std 1), then 20: 10 sigma above the
    # last 1000 values; over all 1500 (std sqrt(34) = 5.8) it would be 1.7 sigma, no spike.
    values = [*steady(500, 0.0, 20.0), *steady(1000, 9.0, 11.0), 20.0]
    assert scored(values).spikes == 1
    assert scored(values, window=1500).spikes == 0


@pytest.mark.parametrize(
    ("history", "value", "spikes"),
    [
        ([1.0] * 100, 1.0, 0),  # a repeat of the constant
        ([1.0] * 100, 1.5, 1),  # any jump above a constant history (OLMo-core: std 0 < 1e-10, never a spike)
        ([1.0] * 100, 1.0 + 1e-9, 1),
        ([1.0] * 99, 1.5, 0),  # one value short of the minimum history: not scored
        (steady(100, -1e-12, 1e-12), 1e-11, 1),  # 10 std above a nearly constant history (OLMo-core: std < 1e-10, none)
        (steady(100, -1e-12, 1e-12), 6.9e-12, 0),  # below 7 std, however small the std
    ],
)
def test_a_constant_or_nearly_constant_history_of_100_values_scores_jumps_by_the_same_rule(history, value, spikes):
    score = scored([*history, value])
    assert (score.spikes, score.steps) == (spikes, len(history) + 1)


def test_a_non_finite_value_is_a_spike_and_stays_out_of_the_window():
    score = scored([*steady(200), math.nan, math.inf, 12.0])
    assert score.spikes == 3 and score.steps == 203
    assert len(score.history) == 201 and all(math.isfinite(v) for v in score.history)


def test_a_restored_state_scores_on_as_an_uninterrupted_one():
    values = [*steady(300), 12.0, *steady(1200, 1.5, 2.5), 9.0]
    whole = scored(values)
    first = scored(values[:700])
    resumed = SpikeScore()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    resumed.add(values[700:])
    assert resumed.state_dict() == whole.state_dict()
    assert (whole.spikes, whole.steps) == (2, 1502)


def test_iid_gaussian_values_spike_at_the_student_t_rate():
    # P(x - mean >= k std_pop) over n previous values = P(t_{n-1} >= k sqrt((n - 1) / (n + 1))); k = 2 (7 is
    # 2.2e-10, too rare to count), n = 100: P(t_99 >= 1.980) = 0.02523, by numerical integration of t's density.
    values = torch.randn(40_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64).tolist()
    score = scored(values, window=100, min_history=100, threshold=2.0)
    assert score.spikes / (score.steps - 100) == pytest.approx(0.02523, abs=0.004)  # 5 sigma of 40,000 draws


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"window": 1}, "spike score window=1 is invalid; it must be an integer >= 2"),
        ({"min_history": 1}, r"spike score min_history=1 is invalid; it must be an integer in \[2, 1000\]"),
        ({"window": 50}, r"spike score min_history=100 is invalid; it must be an integer in \[2, 50\]"),
        ({"threshold": 0.0}, "spike score threshold=0.0 is invalid; it must be a finite number > 0"),
    ],
)
def test_bad_settings_name_the_value_and_the_valid_range(settings, message):
    with pytest.raises(ValueError, match=message):
        SpikeScore(**settings)


def test_a_run_scores_every_step_not_only_logging_steps(tmp_path, monkeypatch):
    """Spikes put into steps 103 (loss), 110 and 111 (gradient norm), none of them a logging step
    (every 7th); the run's scores equal the scores of every value the loop saw, in order."""
    real_step, seen = train_module.train_step, {"loss": [], "grad_norm": []}

    def spiking_step(*args, **kwargs):
        loss, grad_norm, z_loss = real_step(*args, **kwargs)
        step = len(seen["loss"]) + 1
        loss = torch.tensor(50.0) if step == 103 else loss
        grad_norm = torch.tensor(1e3) if step in (110, 111) else grad_norm
        seen["loss"].append(loss.item())
        seen["grad_norm"].append(grad_norm.item())
        return StepResult(loss, grad_norm, z_loss)

    monkeypatch.setattr(train_module, "train_step", spiking_step)
    never = ["trainer.eval_every=1000", "trainer.checkpoint_every=1000", "telemetry.every=0"]
    small = ["trainer.eval_max_examples=5", "trainer.test_max_examples=5"]
    train_module.train(make_cfg("trainer.max_steps=120", "trainer.log_every=7", *never, *small), tmp_path)

    status = json.loads((tmp_path / "status.json").read_text())
    last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "train/loss" in line][-1]
    for series, injected in (("loss", 1), ("grad_norm", 2)):
        expected = scored(seen[series])
        assert expected.steps == 120 and expected.spikes == injected  # no spike of its own in this run
        assert status[f"spike_score_{series}"] == expected.score == injected / 120
        assert last[f"train/spike_score_{series}"] == expected.score
        assert load_checkpoint(tmp_path / "checkpoint.pt")["spikes"][series] == expected.state_dict()
