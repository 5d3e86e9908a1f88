"""The block probes (training/probes.py) against hand computations, and ``python -m scripts.probe`` end to end
on a tiny trained run, its figures shown by the report."""

import copy
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import train as train_module
from data.batching import Seq2SeqData, collate
from data.tokenizer import PAD_ID
from model.config import ModelConfig, NormConfig
from model.powernorm import PowerNorm
from model.transformer import EncoderDecoder
from reporting.page import build_report
from reporting.probe import default_placements
from scripts import probe as probe_script
from tests.helpers.config import make_cfg, model_config
from training.devices import device_choices
from training.evaluate import evaluate_loss
from training.probes import (
    angular_distance,
    batch_dependence,
    first_batch,
    init_output_change,
    layer_drop,
    output_change,
    skip_block,
    stream_distances,
    two_batches,
)

CPU = torch.device("cpu")


def tiny(placement: str = "pre", kind: str = "layernorm") -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=11, tgt_vocab=13, d_model=16, n_heads=2, d_ff=32, n_enc_layers=2, n_dec_layers=2,
                      dropout=0.0, norm=NormConfig(kind=kind, placement=placement))  # fmt: skip
    return EncoderDecoder(cfg).eval()


def pairs(n: int = 6) -> Seq2SeqData:
    """Random pairs of different lengths (ids past the special tokens), so batches are padded."""
    g = torch.Generator().manual_seed(1)
    lengths = [(2 + i % 4, 3 + (i * 2) % 5) for i in range(n)]
    return Seq2SeqData([torch.randint(4, 11, (s,), generator=g).tolist() for s, _ in lengths],
                       [torch.randint(4, 13, (t,), generator=g).tolist() for _, t in lengths])  # fmt: skip


def make_identity(model: EncoderDecoder, stack: str, index: int) -> None:
    """Zero every branch's output projection (weights and biases) of a pre-LN block: x + F(N(x)) = x exactly."""
    block = (model.encoder if stack == "enc" else model.decoder)[index]
    with torch.no_grad():
        for residual in (block.self_attn, getattr(block, "cross_attn", None), block.ffn):
            if residual is not None:
                out = residual.branch.out_proj if hasattr(residual.branch, "out_proj") else residual.branch.linear2
                out.weight.zero_()
                out.bias.zero_()


def test_layer_drop_of_an_identity_block_is_zero_and_of_another_block_is_the_loss_without_it():
    model, data = tiny(), pairs()
    make_identity(model, "enc", 1)
    make_identity(model, "dec", 0)
    full, drops = layer_drop(model, data, 64, CPU)
    assert full == evaluate_loss(model, data, 64, CPU)
    assert drops["enc"][1] == 0.0 and drops["dec"][0] == 0.0  # x -> x skipped by x -> x: bit-identical
    assert abs(drops["enc"][0]) > 1e-4 and abs(drops["dec"][1]) > 1e-4
    without = copy.deepcopy(model)
    del without.decoder[1]  # the decoder stack with block 1 left out
    assert drops["dec"][1] == pytest.approx(evaluate_loss(without, data, 64, CPU) - full, abs=1e-6)


def test_skip_block_puts_the_block_back_and_names_a_bad_index():
    model = tiny()
    block = model.decoder[1]
    with skip_block(model, "dec", 1):
        assert model.decoder[1] is not block
        x = torch.randn(2, 3, 16)
        assert model.decoder[1](x, torch.randn(2, 4, 16), None, None) is x
    assert model.decoder[1] is block
    with pytest.raises(ValueError, match="block index 2 is invalid for the enc stack; valid: 0..1"):
        with skip_block(model, "enc", 2):
            pass
    with pytest.raises(ValueError, match="unknown stack 'mid'; valid: enc, dec"):
        with skip_block(model, "mid", 0):
            pass


def test_angular_distance_by_hand():
    x = torch.tensor([[3.0, -1.0, 2.0]])
    assert angular_distance(x, x).item() == 0.0  # identical
    assert angular_distance(x, -x).item() == 1.0  # opposite
    assert angular_distance(x, 2.5 * x).item() == pytest.approx(0.0, abs=1e-7)  # only the direction counts
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert angular_distance(e1, e2).item() == pytest.approx(0.5, abs=1e-7)  # 90 degrees
    assert angular_distance(e1, torch.tensor([1.0, 1.0])).item() == pytest.approx(0.25, abs=1e-7)  # 45
    assert angular_distance(e1, torch.tensor([1.0, math.sqrt(3)])).item() == pytest.approx(1 / 3, abs=1e-7)  # 60
    assert angular_distance(torch.zeros(2), e1).item() == pytest.approx(0.5, abs=1e-7)  # cos = 0
    a, b = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    torch.testing.assert_close(angular_distance(a, b).double(), torch.arccos(cos) / math.pi, atol=1e-6, rtol=0)


def test_stream_distances_are_the_mean_over_real_tokens_of_the_streams_entering_each_block():
    model, data = tiny(), pairs()
    make_identity(model, "enc", 1)
    got = stream_distances(model, data, 64, CPU)
    batch = collate(data, list(range(len(data))))
    with torch.no_grad():  # the streams by hand: embeddings, then each block's output
        enc = [model.src_embed(batch.src)]
        for block in model.encoder:
            enc.append(block(enc[-1], batch.src_pad_mask))
        memory = model.enc_final_norm(enc[-1])
        dec = [model.tgt_embed(batch.tgt_in)]
        for block in model.decoder:
            dec.append(block(dec[-1], memory, batch.src_pad_mask))
    for stack, xs, real in (("enc", enc, ~batch.src_pad_mask), ("dec", dec, batch.tgt_out.ne(PAD_ID))):
        want = [[angular_distance(a[real], b[real]).mean().item() for b in xs] for a in xs]
        assert torch.tensor(got[stack]) == pytest.approx(torch.tensor(want), abs=1e-6)
    assert got["enc"][1][2] == 0.0 and got["enc"][0][0] == 0.0  # block 1 is x -> x
    one_per_batch = stream_distances(model, data, 9, CPU)  # other batches, other padding: the same means
    for stack in ("enc", "dec"):
        assert torch.tensor(one_per_batch[stack]) == pytest.approx(torch.tensor(got[stack]), abs=1e-6)


def test_output_change_is_zero_without_perturbation_and_grows_as_delta_squared():
    model = tiny("post")
    batch = first_batch(pairs(), 6, CPU)
    before = copy.deepcopy(model.state_dict())
    assert output_change(model, batch, 0.0) == 0.0
    small, double, large = (output_change(model, batch, d) for d in (1e-4, 2e-4, 1e-2))
    assert 0 < small < double < large
    assert double / small == pytest.approx(4.0, rel=0.02)  # first order in delta: |J δ|^2
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name  # the weights are put back


def test_init_output_change_over_placements_and_depths_and_bad_placements():
    batch = first_batch(pairs(), 6, CPU)
    cfg = tiny().cfg
    out = init_output_change(cfg, ["post", "pre"], [1, 2], batch, 1e-3)
    assert list(out) == ["post", "pre"] and all(list(v) == [1, 2] and min(v.values()) > 0 for v in out.values())
    torch.manual_seed(0)  # the same model as init_output_change builds for post at depth 2
    model = EncoderDecoder(ModelConfig(**{**cfg.to_dict(), "n_enc_layers": 2, "n_dec_layers": 2,
                                          "norm": NormConfig(placement="post")}))  # fmt: skip
    assert out["post"][2] == output_change(model, batch, 1e-3)
    with pytest.raises(ValueError, match="unknown norm.placement 'postln'; valid placements: post, pre"):
        init_output_change(cfg, ["postln"], [1], batch, 1e-3)
    with pytest.raises(ValueError, match="norm.kind='dyt' cannot be used with norm.placement='post'"):
        init_output_change(tiny(kind="dyt").cfg, ["post"], [1], batch, 1e-3)
    assert default_placements(tiny(kind="dyt").cfg.norm) == ["pre"]
    # pre_bn's plan (BatchNorm encoder, LayerNorm decoder) keeps its stack kinds: the same model with the decoder's
    # kind in every block entry of the plan; a layer-indexed entry is dropped.
    plan = [{"stack": "dec", "kind": "layernorm"}, {"stack": "enc", "layers": [0], "placement": "post"}]
    bn = replace(cfg, norm=NormConfig(kind="batchnorm", blocks=plan))
    out = init_output_change(bn, ["post"], [2], batch, 1e-3)
    torch.manual_seed(0)
    model = EncoderDecoder(replace(bn, norm=NormConfig(kind="batchnorm", placement="post", blocks=plan[:1])))
    assert out["post"][2] == output_change(model, batch, 1e-3) > 0
    assert default_placements(tiny("b2t").cfg.norm) == ["post", "pre", "admin", "deepnorm", "b2t"]


def preset_model(preset: str) -> EncoderDecoder:
    """A tiny model of the ``norm=<preset>`` preset with dropout on (the probe must turn it off)."""
    torch.manual_seed(0)
    return EncoderDecoder(model_config(make_cfg(f"norm={preset}", "model.dropout=0.3"), 11, 13))


def unequal_batches() -> tuple:
    """Two batches of 3 rows whose padded lengths differ both ways (src 4 vs 5, tgt 5 vs 4)."""
    data = pairs(6)
    a, b = collate(data, [0, 1, 2]), collate(data, [3, 4, 5])
    assert a.src.shape[1] < b.src.shape[1] and a.tgt_in.shape[1] > b.tgt_in.shape[1]
    return a, b


@pytest.mark.parametrize("preset", ["pre_ln", "pre_rms"])
def test_batch_dependence_of_token_wise_norms_is_exactly_zero(preset):
    model = preset_model(preset)
    got = batch_dependence(model, *unequal_batches())
    assert len(got) == 2 * 2 + 1 + 2 * 3 + 1  # two slots per encoder block, three per decoder block, two final norms
    assert list(got)[:2] == ["enc.0.self_attn.norm_in", "enc.0.ffn.norm_in"] and list(got)[-1] == "dec.final_norm"
    assert set(got.values()) == {0.0}


def test_batch_dependence_of_pre_bn_reads_the_batch_in_the_encoder_only_and_changes_nothing():
    model = preset_model("pre_bn").train()
    model.decoder[1].eval()  # a mode that is not the model's: it must come back too
    before = copy.deepcopy(model.state_dict())
    modes = [m.training for m in model.modules()]
    a, b = unequal_batches()
    got = batch_dependence(model, a, b)
    enc = {site: v for site, v in got.items() if site.startswith("enc.")}
    assert len(enc) == 5 and min(enc.values()) > 1e-3  # BatchNorm encoder: the other rows move the statistics
    assert {v for site, v in got.items() if site.startswith("dec.")} == {0.0}  # pre_bn's decoder is LayerNorm
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name  # running statistics and num_batches_tracked put back
    assert [m.training for m in model.modules()] == modes
    assert batch_dependence(model, a, b) == got  # dropout off: the same inputs each time
    # The first site by hand: BatchNorm in training mode over the real tokens of the embeddings (dropout off).
    norm, longer = model.encoder[0].self_attn.norm_in, b.src.shape[1] - a.src.shape[1]
    with torch.no_grad():
        xa, xb = model.eval().src_embed(a.src), model.src_embed(b.src)
        x = torch.cat([torch.nn.functional.pad(xa, (0, 0, 0, longer))[:1], xb[1:]])
        keep = torch.cat([torch.nn.functional.pad(a.src.ne(PAD_ID), (0, longer))[:1], b.src.ne(PAD_ID)[1:]])

        def bn(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.batch_norm(x[keep], None, None, norm.weight, norm.bias, True, 0.0, norm.eps)

        y_a, y_c = bn(xa, a.src.ne(PAD_ID))[: a.src[0].ne(PAD_ID).sum()], bn(x, keep)[: a.src[0].ne(PAD_ID).sum()]
    want = ((y_c - y_a).norm(dim=-1) / y_a.norm(dim=-1)).mean().item()
    assert got["enc.0.self_attn.norm_in"] == pytest.approx(want, rel=1e-5)


def test_batch_dependence_of_powernorm_during_its_warmup_only():
    model = preset_model("pre_pn")
    a, b = unequal_batches()
    during = batch_dependence(model, a, b)
    assert min(v for site, v in during.items() if site.startswith("enc.")) > 1e-3
    for norm in (m for m in model.modules() if isinstance(m, PowerNorm)):
        norm.iters.fill_(norm.warmup_iters)  # the next training-mode call normalizes by the running statistic
    assert set(batch_dependence(model, a, b).values()) == {0.0}


def test_batch_dependence_and_two_batches_name_bad_input():
    model, (a, b) = preset_model("pre_ln"), unequal_batches()
    with pytest.raises(ValueError, match="kept=3 is invalid for batches of 3 rows; valid: 1..2"):
        batch_dependence(model, a, b, kept=3)
    with pytest.raises(ValueError, match="same number of rows, got 3 and 2"):
        batch_dependence(model, a, collate(pairs(), [0, 1]))
    x, y = two_batches(pairs(7), 64, CPU)
    assert x.index == [0, 1, 2] and y.index == [3, 4, 5]
    with pytest.raises(ValueError, match="got 3 pairs, at least 4 needed"):
        two_batches(pairs(3), 64, CPU)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pre-LN G2P run of 10 steps; the probe writes its ``probe/`` into it."""
    path = tmp_path_factory.mktemp("probed_run")
    train_module.train(make_cfg("trainer.max_steps=10", "telemetry.every=0"), path)
    return path


def test_probe_script_writes_json_and_pngs_and_the_report_shows_them(run_dir, tmp_path, capsys):
    argv = [str(run_dir), "--max-examples", "20", "--depths", "1", "2", "--placements", "pre", "post"]
    assert probe_script.main(argv) == 0
    result = json.loads((run_dir / "probe" / "probe.json").read_text())
    assert result["examples"] == 20 and result["delta"] == 1e-3 and result["loss"] > 0
    assert [len(result["layer_drop"][s]) for s in ("enc", "dec")] == [2, 2]
    for stack in ("enc", "dec"):
        matrix = torch.tensor(result["angular_distance"][stack])
        assert matrix.shape == (3, 3) and torch.equal(matrix.diagonal(), torch.zeros(3))
        assert torch.allclose(matrix, matrix.T, atol=1e-6) and matrix.max() <= 1
    assert {p: list(v) for p, v in result["output_change"].items()} == {"pre": ["1", "2"], "post": ["1", "2"]}
    assert len(result["batch_dependence"]) == 12 and set(result["batch_dependence"].values()) == {0.0}  # pre-LN
    for name in ("layer_drop", "angular_distance", "output_change"):
        assert (run_dir / "probe" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = build_report([run_dir], tmp_path / "report").read_text()
    assert "<h2>Probes</h2>" in page and page.count('<img class="probe"') == 3
    assert probe_script.main([str(tmp_path / "nope")]) == 1
    assert "probe: error: no checkpoint file at" in capsys.readouterr().err
    assert probe_script.main([str(run_dir), "--max-examples", "0"]) == 1
    assert "--max-examples=0 is invalid; it must be >= 1" in capsys.readouterr().err


def test_probe_script_names_the_depths_flag_for_a_depth_below_1(run_dir, capsys):
    assert probe_script.main([str(run_dir), "--max-examples", "20", "--depths", "2", "0", "--placements", "pre"]) == 1
    err = capsys.readouterr().err
    assert err == "probe: error: --depths 0 is invalid; each depth (blocks per stack) must be an integer >= 1\n"


def test_probe_script_on_a_device_not_of_this_machine_is_one_line(run_dir, capsys):
    assert probe_script.main([str(run_dir), "--device", "tpu"]) == 1
    valid = ", ".join(device_choices())
    assert capsys.readouterr().err == f"probe: error: --device 'tpu' is not a device of this machine; valid: {valid}\n"


def test_probe_script_on_a_pre_bn_run_reports_the_encoders_batch_dependence(tmp_path):
    train_module.train(make_cfg("norm=pre_bn", "trainer.max_steps=4", "telemetry.every=0"), tmp_path)
    assert probe_script.main([str(tmp_path), "--max-examples", "20", "--depths", "1", "--placements", "pre"]) == 0
    dependence = json.loads((tmp_path / "probe" / "probe.json").read_text())["batch_dependence"]
    assert all((value > 1e-3) == site.startswith("enc.") for site, value in dependence.items())
    assert {v for s, v in dependence.items() if s.startswith("dec.")} == {0.0}
