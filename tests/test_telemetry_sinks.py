"""The two diagnostics of attention sinks and massive activations on constructed inputs: ``attn/.../sink_mass`` (the
share of attention on the first key) at uniform attention (its baseline), at a constructed sink, with a learned sink
and softpick; ``act/{s}.{i}.out/massive`` (max |x| / median |x|) with one planted massive activation."""

import math

import pytest
import torch

from model.config import ModelConfig, NormConfig
from model.transformer import EncoderDecoder
from runlog.metric_names import STATS
from telemetry.config import TelemetryConfig
from tests.helpers.telemetry import batch, doc_table, make, record

SINKS = TelemetryConfig(every=1, stats=STATS, attn_sink_mass=True)  # both diagnostics on, as telemetry=full has them


def attentions(model: EncoderDecoder) -> list[torch.nn.Module]:
    return [layer.self_attn.branch for layer in model.encoder] + [
        r.branch for layer in model.decoder for r in (layer.self_attn, layer.cross_attn)
    ]


def test_uniform_attention_puts_one_over_the_key_count_on_the_first_key():
    model = make().eval()
    for attn in attentions(model):
        torch.nn.init.zeros_(attn.q_proj.weight)  # every logit equal: uniform attention
        torch.nn.init.zeros_(attn.q_proj.bias)
    src, tgt_in, tgt_out = batch(pad=False)  # 9 keys everywhere
    stats = record(model, src, tgt_in, tgt_out, SINKS)
    assert stats["attn/enc.0.self_attn/sink_mass"] == pytest.approx(1 / 9, rel=1e-5)
    assert stats["attn/dec.1.cross_attn/sink_mass"] == pytest.approx(1 / 9, rel=1e-5)
    # causal: query t sees t + 1 keys
    assert stats["attn/dec.0.self_attn/sink_mass"] == pytest.approx(sum(1 / (t + 1) for t in range(9)) / 9, rel=1e-5)


def test_a_constructed_sink_takes_almost_all_the_attention_and_padding_queries_do_not_count():
    """Every query is the all-3 vector, every key the stream itself: the first position's stream set to all-3 (others
    near 0) gives it the logit K * 9 / sqrt(K) = 25.5 in every head, the others about 0."""
    model = make().eval()
    attn = model.encoder[0].self_attn.branch
    D = attn.q_proj.in_features
    with torch.no_grad():
        attn.q_proj.weight.zero_()
        attn.q_proj.bias.fill_(3.0)
        attn.k_proj.weight.copy_(torch.eye(D))
        attn.k_proj.bias.zero_()
    src, tgt_in, tgt_out = batch()
    pad = src.eq(0)

    def planted(mod, args):  # the stream entering the attention: position 0 all-3, the rest small
        x = torch.randn_like(args[0]) * 0.01
        x[:, 0] = 3.0
        return (x, *args[1:])

    handle = attn.register_forward_pre_hook(planted)
    stats = record(model, src, tgt_in, tgt_out, SINKS)
    handle.remove()
    assert pad.any() and stats["attn/enc.0.self_attn/sink_mass"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("control", [{"attn_sink": True}, {"attn_softmax": "softpick"}])
def test_sink_mass_reads_the_weights_the_attention_applies(control):
    """With a learned sink (or softpick) the rows sum to less than 1: sink_mass is the first key's weight as the model
    applies it, not the plain softmax's."""
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab=30, tgt_vocab=40, d_model=32, n_heads=4, d_ff=64, n_enc_layers=1, n_dec_layers=1,
                      dropout=0.0, norm=NormConfig(), **control)  # fmt: skip
    model = EncoderDecoder(cfg).eval()
    attn = model.encoder[0].self_attn.branch
    if attn.sinks is not None:
        with torch.no_grad():
            attn.sinks.fill_(3.0)  # a large share to the sink
    seen = {}
    attn.q_tap.register_forward_hook(lambda m, a, out: seen.__setitem__("q", out))
    attn.k_tap.register_forward_hook(lambda m, a, out: seen.__setitem__("k", out))
    src, tgt_in, tgt_out = batch(pad=False)
    stats = record(model, src, tgt_in, tgt_out, SINKS)
    with torch.no_grad():
        w = attn.weights(seen["q"], seen["k"])
        plain = torch.softmax(attn.logits(seen["q"], seen["k"]), -1)
    assert stats["attn/enc.0.self_attn/sink_mass"] == pytest.approx(w[..., 0].mean().item(), rel=1e-5)
    assert w.sum(-1).mean() < 0.9 and w[..., 0].mean() < plain[..., 0].mean()


def test_one_planted_massive_activation_is_max_over_median():
    model = make().eval()
    src, tgt_in, tgt_out = batch()
    real = ~src.eq(0)
    kept = {}

    def plant(mod, args, out):  # one entry of a real position 1000x the stream's scale
        out = out.clone()
        out[0, 1, 5] = 1000.0
        kept["x"] = out[real].abs()
        return out

    handle = model.encoder[1].register_forward_hook(plant)
    stats = record(model, src, tgt_in, tgt_out, SINKS)
    handle.remove()
    expected = 1000.0 / kept["x"].median().item()  # the lower middle value, as torch.median
    assert stats["act/enc.1.out/massive"] == pytest.approx(expected, rel=1e-5) and expected > 500
    # without it, the block's output is near-Gaussian: about 4 / 0.67 = 6 at these few thousand elements
    assert 3 < stats["act/enc.0.out/massive"] < 12
    assert "act/enc.0.in/massive" not in stats  # block outputs only


def test_the_docs_gaussian_massive_table_is_e_max_over_the_median_and_holds_in_draws():
    crest = {int(r[2].replace(",", "")): float(r[3]) for r in doc_table("tokens")}  # n -> E[M_n], the max table
    rows = doc_table("elements n")
    assert len(rows) == 3
    median = torch.special.ndtri(torch.tensor(0.75, dtype=torch.float64)).item()  # 0.6745
    density = 2 * math.exp(-(median**2) / 2) / math.sqrt(2 * math.pi)  # of |z| at its median
    assert 1 / (2 * density * median) == pytest.approx(1.17, abs=0.005)
    gen = torch.Generator().manual_seed(0)
    for n, e_max, massive in ([c.replace(",", "") for c in r] for r in rows):
        assert float(e_max) == crest[int(n)] and float(massive) == pytest.approx(float(e_max) / median, abs=0.005)
        if int(n) <= 524_288:  # a few draws through the derivation telemetry uses: max / lower median
            x = torch.randn(8, int(n), generator=gen).abs()
            ratio = (x.amax(1) / x.median(1).values).mean().item()
            assert ratio == pytest.approx(float(massive), abs=0.35 / math.sqrt(8) * 3)
