"""scripts/estimate_time.py: the FLOPs it counts against a hand count, its wall-time arithmetic, its errors, and the
expected times written in the GPU preset and docs/scale.md against what it prints."""

import re
from dataclasses import replace

import pytest
import torch
from hydra import compose, initialize_config_dir

from benchmarks import estimate_time as est
from data.batching import Batch, collate, make_batches
from data.tokenizer import PAD_ID
from model.config import ModelConfig
from model.transformer import EncoderDecoder
from scripts import estimate_time as cli
from tests.helpers.config import ROOT
from training.flops import PEAK_BF16_FLOPS, counted_train_flops
from training.schema import validate
from training.tasks import build_task

PRESET = ROOT / "conf" / "experiment" / "lr_sensitivity_gpu.yaml"
ONE_JOB = ["+experiment=lr_sensitivity_gpu", "norm=pre_ln", "optim.lr=3e-4", "seed=0"]  # the sweep's first-listed values


def test_counted_flops_equal_a_hand_count_of_every_matmul_on_a_tiny_model():
    B, S, T, D, H, F, V = 2, 3, 4, 8, 2, 16, 9
    cfg = ModelConfig(src_vocab=7, tgt_vocab=V, pad_id=PAD_ID, d_model=D, n_heads=H, d_ff=F, n_enc_layers=1,
                      n_dec_layers=1, dropout=0.0)  # fmt: skip
    # Multiply-accumulates of the forward pass, matmul by matmul (attention: QK^T and AV, over all heads).
    encoder = 4 * B * S * D * D + 2 * B * S * D * F + 2 * B * S * S * D  # q, k, v, out; FFN in, out; attention
    decoder = (4 * B * T * D * D + 2 * B * T * T * D  # self-attention: q, k, v, out; attention
               + 2 * B * T * D * D + 2 * B * S * D * D + 2 * B * T * S * D  # cross: q, out on tgt; k, v on src; attention
               + 2 * B * T * D * F)  # FFN  # fmt: skip
    output = B * T * D * V
    forward = 2 * (encoder + decoder + output)  # 2 FLOPs a multiply-accumulate
    src = torch.randint(4, 7, (B, S))
    tgt = torch.randint(4, V, (B, T + 1))
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], [0, 1], B * T)
    # Exact: every matmul of the step is counted, nothing else is (tolerance 0).
    assert counted_train_flops(EncoderDecoder(cfg), [batch], 0.1) == (forward, 3 * forward)
    with torch.device("meta"):
        meta_model = EncoderDecoder(cfg)
    meta_batch = Batch(*(t.to("meta") for t in (src, tgt[:, :-1], tgt[:, 1:])), [0, 1], B * T)
    assert counted_train_flops(meta_model, [meta_batch], 0.1) == (forward, 3 * forward)


def test_wall_time_is_flops_over_peak_times_mfu():
    e = est.Estimate("norm=a", 120, (1, 1), (1, 1, 1), counted=9e12, formula=9e12, steps=1000, epochs=1.0,
                     loss_flops=3e14, decode_flops=6e13, decoder_calls=0)  # fmt: skip
    assert e.run_flops == 9.36e15
    assert est.wall_seconds(e.run_flops, PEAK_BF16_FLOPS["A100"], 0.5) == pytest.approx(60.0)  # 9.36e15 / 156e12
    text = est.table([e], "A100", 0.5)
    assert "| 1.0 min | 2.0 h |" in text  # per run; 120 runs
    assert "all 120 runs: 2.0 h on one A100" in text and "peak 312 TFLOP/s" in text and "MFU 0.5" in text
    assert [est.duration(s) for s in (42, 90, 7200)] == ["42 s", "1.5 min", "2.0 h"]
    with pytest.raises(ValueError, match=r"--mfu=0 is invalid; MFU is a fraction of the peak in \(0, 1\]"):
        est.wall_seconds(1.0, 1.0, 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trainer.max_step=3"], "trainer.max_step is not a key of trainer; did you mean trainer.max_steps"),
        (["seed=abc"], "seed='abc' is invalid: expected an integer"),
        (["model=bigg"], "unknown model preset 'bigg'; valid: base, mini, small, tiny"),
        (["norm=layernorm"], "norm=layernorm is not a preset; did you mean norm.kind=layernorm"),
        (["--mfu", "1.5"], "--mfu=1.5 is invalid; MFU is a fraction of the peak in (0, 1]"),
    ],
)
def test_a_bad_override_or_mfu_is_one_line_and_exit_code_2(args, message, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"estimate_time: error: {message}") and err.count("\n") == 1


def test_a_sweep_expands_into_hydras_jobs_with_hydras_configs():
    jobs = est.job_configs(["+experiment=warmup_depth", "trainer.max_steps=50"])
    assert len(jobs) == 3 * 3 * 3  # norm x warmup x seed
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for job, cfg in jobs[::7]:
            assert cfg == validate(compose("config", overrides=job))
    assert {cfg.trainer.max_steps for _, cfg in jobs} == {50}
    assert {(cfg.model.norm.placement, cfg.schedule.warmup_steps, cfg.seed) for _, cfg in jobs} == {
        (p, w, s) for p in ("post", "pre", "admin") for w in (0, 60, 300) for s in (0, 1, 2)
    }


def stated_times(text: str) -> tuple[float, str, str]:
    """(MFU, time per run, time of all runs) of the ``Expected on one H200`` line of ``text``."""
    match = re.search(r"at MFU ([\d.]+) \(assumed\): ([\d.]+ (?:s|min|h)) per run, ([\d.]+ (?:s|min|h)) for all", text)
    assert match, "no 'at MFU m (assumed): X per run, Y for all' line"
    return float(match[1]), match[2], match[3]


def test_the_per_run_time_in_the_gpu_preset_and_docs_is_what_the_tool_prints():
    (estimate,) = est.estimate(ONE_JOB)
    for text in (PRESET.read_text(), (ROOT / "docs" / "scale.md").read_text()):
        mfu, per_run, _ = stated_times(text)
        assert mfu == est.DEFAULT_MFU
        assert per_run == est.duration(est.wall_seconds(estimate.run_flops, PEAK_BF16_FLOPS["H200"], mfu))
    assert estimate.counted == pytest.approx(estimate.formula, rel=1e-6)  # the formula's check at GPU size
    assert f"~{estimate.epochs:.0f} epochs of CMUdict" in PRESET.read_text()


def test_the_validation_loss_is_a_counted_forward_pass_over_valid_at_step_0_and_at_each_validation():
    tiny = ["model=tiny", "trainer.max_steps=100", "trainer.eval_every=50", "trainer.max_tokens=16384"]
    (estimate,) = est.estimate(tiny)
    cfg = est.job_configs(tiny)[0][1]
    task = build_task(cfg, None, None)
    mcfg = replace(cfg.model, src_vocab=task.src_vocab.get_vocab_size(), tgt_vocab=task.tgt_vocab.get_vocab_size(), pad_id=PAD_ID)
    with torch.device("meta"):
        model = EncoderDecoder(mcfg)
    valid = task.data["valid"]
    loss_pass = sum(counted_train_flops(model, [collate(valid, i).to("meta")], 0.0)[0] for i in make_batches(valid, 16384))
    assert estimate.loss_flops == pytest.approx(3 * loss_pass, rel=1e-9)  # steps 0, 50 and 100
    assert estimate.decode_flops > 0 and estimate.decoder_calls > 0


@pytest.mark.slow  # the whole sweep: 168 configs, 8 models counted (about 30 s)
def test_the_sweep_table_in_the_docs_and_its_total_in_the_preset_are_what_the_tool_prints():
    printed = est.table(est.estimate(["+experiment=lr_sensitivity_gpu"]), est.DEFAULT_GPU, est.DEFAULT_MFU)
    assert printed in (ROOT / "docs" / "scale.md").read_text()
    total = re.search(r"all 168 runs: ([\d.]+ h)", printed)[1]
    assert stated_times(PRESET.read_text())[2] == total


@pytest.mark.parametrize("preset", ["g2p_wu2021", "warmup_depth_long"])
def test_the_gpu_presets_headers_state_what_the_tool_prints(preset):
    estimates = est.estimate([f"+experiment={preset}"])
    printed = est.table(estimates, est.DEFAULT_GPU, est.DEFAULT_MFU)
    total = re.search(r"all (\d+) runs?: ([\d.]+ \w+) on one H200", printed)
    per_run = re.findall(r"\| ([\d.]+ \w+) \| [\d.]+ \w+ \|\n", printed)  # each row's "per run" column
    header = (ROOT / "conf" / "experiment" / f"{preset}.yaml").read_text()
    assert "MFU 0.15 (assumed" in header and len(set(per_run)) == 1 and f": {per_run[0]} per run" in header
    if total[1] != "1":  # a sweep also states its total
        assert f"{per_run[0]} per run, {total[2]} for all {total[1]}," in header


@pytest.mark.slow  # 20 and 12 models counted (about 1 min)
@pytest.mark.parametrize(("preset", "axis"), [("width_transfer_gpu", "width"), ("depth_transfer_gpu", "depth")])
def test_the_transfer_gpu_presets_state_the_range_of_per_run_times_and_the_total_the_tool_prints(preset, axis):
    # one row per width (depth), the narrowest (shallowest) first: each row's per-run time, then the total
    printed = est.table(est.estimate([f"+experiment={preset}"]), est.DEFAULT_GPU, est.DEFAULT_MFU)
    total = re.search(r"all (\d+) runs: ([\d.]+ \w+) on one H200", printed)
    per_run = re.findall(r"\| ([\d.]+ \w+) \| [\d.]+ \w+ \|\n", printed)
    points = re.findall(rf"{axis}=[dl](\d+);", printed)
    header = " ".join((ROOT / "conf" / "experiment" / f"{preset}.yaml").read_text().replace("#", " ").split())
    stated = f"{per_run[0]} ({axis} {points[0]}) to {per_run[-1]} ({axis} {points[-1]}) per run, {total[2]} for all {total[1]}"
    assert "MFU 0.15 (assumed)" in header and stated in header


@pytest.mark.parametrize("hc", ["dynamic", "mhc"])
def test_hyper_connections_count_on_the_meta_device_as_on_the_cpu(hc):
    # mHC's float32 region is torch.autocast, which the meta device does not have: it raised ("unsupported scalarType")
    cfg = ModelConfig(src_vocab=7, tgt_vocab=9, pad_id=PAD_ID, d_model=8, n_heads=2, d_ff=16, n_enc_layers=1,
                      n_dec_layers=1, dropout=0.0)  # fmt: skip
    cfg = replace(cfg, norm=replace(cfg.norm, hc=hc), residual_streams=4)
    src, tgt = torch.randint(4, 7, (2, 3)), torch.randint(4, 9, (2, 5))
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], [0, 1], 8)
    cpu = counted_train_flops(EncoderDecoder(cfg), [batch], 0.1)
    with torch.device("meta"):
        meta_model = EncoderDecoder(cfg)
    meta_batch = Batch(*(t.to("meta") for t in (src, tgt[:, :-1], tgt[:, 1:])), [0, 1], 8)
    assert counted_train_flops(meta_model, [meta_batch], 0.1) == cpu and cpu[1] > 0


def test_a_model_that_cannot_run_on_the_meta_device_is_named_in_one_line():
    with pytest.raises(ValueError, match="this run: its model cannot be counted on the meta device"):
        est.estimate(["norm=pre_bn", "model=tiny"])  # BatchNorm's statistics over the real tokens index by value
