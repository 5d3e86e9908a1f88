"""Pre-LN is Pre-RMSNorm: the strongest check that LayerNorm and RMSNorm compute what they claim.

Jiang et al. 2023, "Pre-RMSNorm and Pre-CRMSNorm Transformers: Equivalent and Efficient Pre-LN
Transformers" (NeurIPS 2023, arXiv 2305.14858), sec. 3: in a pre-LN Transformer every LayerNorm
reads the residual stream x only through x - mean(x). Centre (over D) everything that writes into
the stream and the stream has zero mean, so LayerNorm's centring is a no-op and its population
variance is RMSNorm's mean square: ``LN(x) = g * xhat + beta = RMSNorm_g(x) + beta`` with the same
eps. Each beta then folds into the linear layers that read that norm:
``W (g * xhat + beta) + b = W (g * xhat) + (W beta + b)``.

The test walks a real pre-LN ``EncoderDecoder`` (float64, dropout 0, eval mode, every parameter
moved off its init), applies that transformation to its own modules, and asks for the same
logits to 1e-10; the same swap without the centring must differ (the negative control).
"""

import copy

import pytest
import torch
from torch import nn

from model.attention import MultiHeadAttention
from model.config import ModelConfig, NormConfig
from model.layers import FeedForward
from model.norms import LayerNorm, RMSNorm
from model.residual import Residual
from model.transformer import Embedding, EncoderDecoder

D, SRC_VOCAB, TGT_VOCAB, PAD = 16, 11, 13, 0
N_ENC, N_DEC = 2, 2
RMS_OF = {LayerNorm: RMSNorm, nn.LayerNorm: nn.RMSNorm}  # custom -> custom, native -> native


def pre_ln_model(impl: str, positions: str) -> EncoderDecoder:
    """A pre-LN model in float64 with every parameter (norm gains and biases too) off its init.

    ``tie_embeddings=False``: tied, the output matrix *is* the target embedding, so centring the
    embedding's rows would also centre the output matrix's rows and change every logit by
    ``-rowmean(E)_v * sum(g * xhat)``, which is not zero. ``src_vocab != tgt_vocab`` keeps the
    two embeddings apart (no ``share_embeddings``); sharing would be harmless, both get centred.
    """
    cfg = ModelConfig(
        src_vocab=SRC_VOCAB, tgt_vocab=TGT_VOCAB, pad_id=PAD, d_model=D, n_heads=4, d_ff=32,
        n_enc_layers=N_ENC, n_dec_layers=N_DEC, dropout=0.0, max_len=8, positions=positions,
        tie_embeddings=False, norm=NormConfig(kind="layernorm", impl=impl, placement="pre"),
    )  # fmt: skip
    torch.manual_seed(0)
    model = EncoderDecoder(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))  # gains ~ 1 + N(0, 0.25), biases ~ N(0, 0.25): none is 1 or 0
    return model


def centre_rows(t: torch.Tensor) -> None:
    """Subtract, in place, the mean over the last (d_model) axis."""
    t.sub_(t.mean(dim=-1, keepdim=True))


def centre_writer(linear: nn.Linear) -> None:
    """Make ``linear`` write a zero-mean vector into the stream: centre W (D_out, D_in) across its
    output rows and b across D_out, i.e. ``W <- (I - 11^T/D) W``, ``b <- (I - 11^T/D) b``."""
    linear.weight.sub_(linear.weight.mean(dim=0, keepdim=True))
    centre_rows(linear.bias)


def centre_stream(model: EncoderDecoder) -> None:
    """Centre every write into the residual stream: token embeddings, position tables, and the
    output side of every attention ``out_proj`` and FFN ``linear2`` (self, cross, both stacks)."""
    found = {Embedding: 0, MultiHeadAttention: 0, FeedForward: 0}
    for module in model.modules():
        if isinstance(module, Embedding):
            centre_rows(module.tokens.weight)
            centre_rows(module.positions.weight if module.cfg.positions == "learned" else module.pos_table)
        elif isinstance(module, MultiHeadAttention):
            centre_writer(module.out_proj)
        elif isinstance(module, FeedForward):
            centre_writer(module.linear2)
        else:
            continue
        found[type(module)] += 1
    assert found == {Embedding: 2, MultiHeadAttention: N_ENC + 2 * N_DEC, FeedForward: N_ENC + N_DEC}


def to_rms(ln: nn.Module) -> nn.Module:
    """The RMSNorm of ``ln``'s impl with ``ln``'s gain and eps (no bias: it is folded elsewhere)."""
    rms = RMS_OF[type(ln)](ln.weight.numel(), eps=ln.eps).to(ln.weight)
    rms.weight.copy_(ln.weight)
    return rms


def fold_bias(beta: torch.Tensor, readers: list[nn.Linear]) -> None:
    """``W (y + beta) + b = W y + (W beta + b)`` for every linear layer that reads the norm."""
    for linear in readers:
        linear.bias.add_(linear.weight @ beta)


def swap_norms(model: EncoderDecoder) -> int:
    """Replace every LayerNorm by an RMSNorm with its gain, its beta folded into its readers:
    q/k/v of the attention it feeds (q only for cross-attention, whose k/v read the memory),
    ``linear1`` of the FFN; the encoder's final norm feeds every cross-attention's k/v.
    Returns how many norms were swapped."""
    swapped = 0
    for name, res in model.named_modules():
        if not isinstance(res, Residual) or type(res.norm_in) not in RMS_OF:
            continue
        branch = res.branch
        if isinstance(branch, FeedForward):
            readers = [branch.linear1]
        elif name.endswith("cross_attn"):
            readers = [branch.q_proj]
        else:
            readers = [branch.q_proj, branch.k_proj, branch.v_proj]
        fold_bias(res.norm_in.bias, readers)
        res.norm_in = to_rms(res.norm_in)
        swapped += 1
    enc_final, dec_final = model.enc_final_norm, model.dec_final_norm
    cross = [layer.cross_attn.branch for layer in model.decoder]
    fold_bias(enc_final.bias, [proj for attn in cross for proj in (attn.k_proj, attn.v_proj)])
    # The decoder's final norm feeds the output projection, which has no bias in normlab, so
    # W_out beta (a different number per vocabulary entry, not a softmax-invariant constant) has
    # nowhere to go inside the architecture. The exact fold is a logit bias: the Pre-RMSNorm twin
    # of a pre-LN normlab model is that model plus ``output.bias = W_out beta`` (Jiang et al. fold
    # it into the classifier's bias the same way); without it only beta_final = 0 would be exact.
    output = nn.Linear(D, TGT_VOCAB, bias=True).to(model.output.weight)
    output.weight.copy_(model.output.weight)
    output.bias.copy_(model.output.weight @ dec_final.bias)
    model.output = output
    model.enc_final_norm, model.dec_final_norm = to_rms(enc_final), to_rms(dec_final)
    return swapped + 2


def pre_rms_twin(model: EncoderDecoder, *, centre: bool) -> EncoderDecoder:
    """A copy of ``model`` with every LayerNorm swapped for an RMSNorm (``centre``: after centring
    the stream's writers first, as Jiang et al. sec. 3; without it, the negative control)."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        if centre:
            centre_stream(twin)
        assert swap_norms(twin) == 2 * N_ENC + 3 * N_DEC + 2  # every filled slot and both final norms
    assert not any(type(m) in RMS_OF for m in twin.modules())
    return twin


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (3, 7) with right padding in two rows, its pad mask, tgt_in (3, 5)."""
    torch.manual_seed(1)
    src = torch.randint(1, SRC_VOCAB, (3, 7))
    src[0, 4:], src[1, 6:] = PAD, PAD
    tgt_in = torch.randint(1, TGT_VOCAB, (3, 5))
    return src, src.eq(PAD), tgt_in


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
@pytest.mark.parametrize("impl", ["custom", "native"])
def test_pre_ln_equals_pre_rmsnorm(impl, positions):
    model = pre_ln_model(impl, positions)
    twin = pre_rms_twin(model, centre=True)
    src, mask, tgt_in = batch()
    with torch.no_grad():
        logits, twin_logits = model(src, tgt_in), twin(src, tgt_in)
        # The twin's memory lacks the encoder final norm's beta, which its cross-attention k/v absorbed.
        memory, twin_memory = model.encode(src, mask), twin.encode(src, mask) + model.enc_final_norm.bias
    assert logits.dtype == torch.float64 and logits.shape == (3, 5, TGT_VOCAB)
    assert logits.abs().max() > 1.0  # not a degenerate all-zero comparison
    torch.testing.assert_close(twin_memory, memory, atol=1e-10, rtol=0)
    torch.testing.assert_close(twin_logits, logits, atol=1e-10, rtol=0)


@pytest.mark.parametrize("impl", ["custom", "native"])
def test_swap_without_centring_differs(impl):
    # The stream of the original model is not centred, so LN != RMSNorm + beta there. This also
    # catches an RMSNorm that secretly subtracts the mean: the difference would vanish.
    model = pre_ln_model(impl, "sinusoidal")
    twin = pre_rms_twin(model, centre=False)
    src, _, tgt_in = batch()
    with torch.no_grad():
        diff = (twin(src, tgt_in) - model(src, tgt_in)).abs().max().item()
    assert diff > 1e-3
