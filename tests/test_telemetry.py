"""telemetry/ as the step uses it (telemetry/__init__.py, telemetry/core.py): the configuration, when it
records, the three named points of a training step (bit-identical training with it on or off, eager and
compiled; nothing recorded or left behind off a record step), the first non-finite value, and the docs'
table of what each group records. Helpers shared by the tests of each telemetry module live here."""

import copy

import pytest
import torch
import torch.nn.functional as F

from data.batching import Batch
from model.transformer import EncoderDecoder
from runlog.metric_names import SITE_GROUPS, depth_profile, parse
from telemetry.config import TelemetryConfig
from telemetry.core import first_nonfinite
from telemetry.recorder import Telemetry
from tests.helpers.telemetry import FULL, batch, doc_pattern, doc_table, make, train_steps, watch_backward


@pytest.mark.parametrize("placement", ["post", "pre", "sandwich", "deepnorm"])
def test_outputs_are_bit_identical_with_telemetry_on_and_off(placement):
    model = make(placement).eval()
    src, tgt_in, tgt_out = batch()
    plain = model(src, tgt_in)
    with Telemetry(model, FULL).watch(src.eq(0), tgt_out.eq(0)):
        watched = model(src, tgt_in)
    assert torch.equal(plain, watched)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # nothing left behind


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_training_is_bit_identical_with_telemetry_on_and_off_with_dropout(compiled):
    model = make(n=1, dropout=0.1)
    init = copy.deepcopy(model.state_dict())
    if compiled:
        model.compile_layers()

    def run(every: int, stance: str = "default"):  # one model, so its layers compile once
        model.load_state_dict(init)
        with torch.compiler.set_stance(stance):
            return train_steps(model, every)

    off_losses, _, off_weights, off_rng = run(0)
    on_losses, on_stats, on_weights, on_rng = run(2)  # records steps 1, 2 and 4
    assert [bool(s) for s in on_stats] == [True, True, False, True]
    assert {parse(k).family for k in on_stats[0]} >= {"weight", "scale", "optim"}  # parameter and AdamW telemetry ran too
    assert "update/enc.0/adam_rms" in on_stats[0] and "update/enc.0/ratio" not in on_stats[0]
    assert on_losses == off_losses
    assert all(torch.equal(a, b) for a, b in zip(on_weights, off_weights, strict=True))
    assert torch.equal(on_rng, off_rng)
    # Compiled layers draw eager's dropout masks: the same losses and generator state as an eager
    # run, and telemetry's extra eager pass sees the masks of the training pass it describes.
    eager_losses, eager_stats, _, eager_rng = run(2, "force_eager")
    assert on_losses == pytest.approx(eager_losses, rel=1e-5)
    assert torch.equal(on_rng, eager_rng)
    assert on_stats[0].keys() == eager_stats[0].keys()
    for key, value in eager_stats[0].items():
        # adam_rms reads the training pass's gradients, where a key bias's is rounding noise (its exact
        # gradient is 0) that compiled and eager kernels round differently: at step 1 each such coordinate
        # adds some g^2 / eps^2 in [0, 1): the 32 (64) of an encoder (decoder) block's 8544 (12832)
        # coordinates move its adam_rms by up to 0.19 % (0.25 %). The same coordinates sit near AdamW's eps,
        # so the two kernels put a few of them on either side of it: below_eps moved by 0.18 % on one machine.
        rel = 3e-3 if parse(key).stat in ("adam_rms", "below_eps") else 1e-5
        assert on_stats[0][key] == pytest.approx(value, rel=rel, abs=1e-6), key


def test_named_points_record_nothing_and_leave_no_hook_off_a_record_step():
    model = make()
    src, tgt_in, tgt_out = batch()
    b = Batch(src, tgt_in, tgt_out, list(range(len(src))), int(tgt_out.ne(0).sum()))
    tele = Telemetry(model, FULL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tele.around_forward(b, record=False):
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
        logits = model(src, tgt_in)
    F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=0).backward()
    tele.after_backward(record=False)
    with tele.around_update(opt, record=False):
        opt.step()
    assert tele.collect() == {}
    with tele.around_forward(b, record=True):
        model(src, tgt_in)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # removed on exit
    assert {"act/enc.0.out/rms", "attn/dec.1.cross_attn/entropy", "out/logz"} <= tele.collect().keys()


def test_records_at_init_every_n_steps_and_at_the_end():
    tele = Telemetry(make(), TelemetryConfig(every=50))
    assert [s for s in range(1, 121) if tele.due(s, 120)] == [1, 50, 100, 120]
    assert not any(Telemetry(make(), TelemetryConfig(every=0)).due(s, 120) for s in range(1, 121))


def test_unknown_site_or_stat_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match="unknown telemetry.sites \\['outt'\\]; valid sites: embed, in, branch, norm, out, final_norm"
    ):
        TelemetryConfig(sites=("outt",))
    with pytest.raises(
        ValueError, match="unknown telemetry.stats \\['kurt'\\]; valid stats: rms, mean, maxabs, crest, kurtosis, token_cos, mass"
    ):
        TelemetryConfig(stats=("kurt",))


def test_first_nonfinite_names_the_first_site_in_forward_order():
    model = make("post").eval()
    with torch.no_grad():
        model.encoder[1].ffn.branch.linear2.bias.fill_(float("inf"))
    src, tgt_in, tgt_out = batch()
    tele = Telemetry(model, TelemetryConfig(every=1))
    with tele.watch(src.eq(0), tgt_out.eq(0)):
        model(src, tgt_in)
    assert first_nonfinite(tele.collect()) == "act/enc.1.ffn/rms"


def test_depth_profile_orders_encoder_then_decoder():
    stats = {
        "act/enc.0.out/rms": 1.0,
        "act/enc.1.out/rms": 2.0,
        "act/dec.0.out/rms": 3.0,
        "act/enc.embed/rms": 9.0,
        "grad/enc.0/norm": 5.0,
    }
    assert depth_profile(stats) == {"out": [(0, 1.0), (1, 2.0), (2, 3.0)]}


def record_step(model: EncoderDecoder, cfg: TelemetryConfig) -> dict[str, float]:
    """Everything ``cfg`` records on one AdamW step of ``model`` over ``batch()``."""
    tele = Telemetry(model, cfg)
    watch_backward(tele, model, *batch())
    tele.parameters.record()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tele.optimizer.watch_update():
        opt.step()
    tele.optimizer.record_adam(opt)
    model.zero_grad()
    return tele.collect()


SWITCHES = ("grads", "updates", "attn_entropy", "attn_max_logit", "attn_sink_mass", "logits", "weights", "scales", "adam",
            "batch_stats")  # fmt: skip


def test_docs_metric_names_table_is_what_each_group_records():
    rows = [[c.strip("`") for c in row] for row in doc_table("recorded by")]
    assert len(rows) == 27
    # Between them, every kind of site: q/k/v norms, residual gates, an l2 QK-norm temperature, closing norms, GPAS gates,
    # batch-reading norms (PowerNorm in the encoder, BatchNorm in the decoder).
    models = [make("sandwich", qk="rmsnorm", v="layernorm"), make("layerscale", qk="l2"), make("post", gpas=True),
              make(kind="batchnorm", blocks=[{"stack": "enc", "kind": "powernorm"}], decoder_batch_stats=True)]  # fmt: skip
    for group in dict.fromkeys(row[0] for row in rows):
        flags = {flag: group == flag for flag in SWITCHES}
        cfg = TelemetryConfig(every=1, sites=(group,) if group in SITE_GROUPS else (), **flags)
        stats = {key: value for model in models for key, value in record_step(model, cfg).items()}
        patterns = [(doc_pattern(pattern), example) for g, pattern, example, _ in rows if g == group]
        for regex, example in patterns:
            assert example in stats and regex.fullmatch(example) and parse(example), (group, example)
        for key in stats:  # every name the group records has its row, and parses back
            assert any(regex.fullmatch(key) for regex, _ in patterns) and parse(key).name == key, (group, key)


def test_the_extra_eager_pass_of_a_compiled_model_leaves_running_statistics_as_they_were(monkeypatch):
    # A compiled model gets one more forward pass on record steps, in training mode: only the training pass
    # may move a batch-reading norm's running statistics.
    model = make(kind="batchnorm", decoder_batch_stats=True)
    tele = Telemetry(model, FULL)
    monkeypatch.setattr(tele, "_compiled", lambda: True)  # that pass, without compiling
    src, tgt_in, tgt_out = batch()
    before = {name: b.clone() for name, b in model.named_buffers()}
    with tele.around_forward(Batch(src, tgt_in, tgt_out, list(range(6)), int(tgt_out.ne(0).sum())), record=True):
        pass  # the training pass runs here
    assert "encoder.0.self_attn.norm_in.running_mean" in before
    assert all(torch.equal(b, before[name]) for name, b in model.named_buffers())
    model(src, tgt_in)  # the control: a training-mode pass does move them
    assert not torch.equal(dict(model.named_buffers())["encoder.0.self_attn.norm_in.running_mean"],
                           before["encoder.0.self_attn.norm_in.running_mean"])  # fmt: skip
