"""normlab's post-LN / pre-LN layers reproduce torch.nn.TransformerEncoderLayer/DecoderLayer.

Weights are copied across; eval mode; fp32; padding masks on src and tgt. Only non-padding
positions are compared: PyTorch's encoder fast path returns zeros at padding, normlab does not.

The one intended difference: ``torch.nn.Transformer`` puts a final LayerNorm after each stack
in post-LN too; normlab's post-LN stacks end without one (the last block already normalizes).
"""

import pytest
import torch
from torch import nn

from model.config import ModelConfig, NormConfig
from model.layers import DecoderLayer, EncoderLayer
from model.transformer import EncoderDecoder
from tests.helpers.parity import copy_attention, copy_ffn_and_norms, randomize

D, H, F_FF = 32, 4, 64


def cfg(placement: str) -> ModelConfig:
    return ModelConfig(src_vocab=10, tgt_vocab=10, d_model=D, n_heads=H, d_ff=F_FF, n_enc_layers=1, n_dec_layers=1,
                       dropout=0.0, norm=NormConfig(kind="layernorm", impl="custom", placement=placement))  # fmt: skip


def masks():
    src_pad = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])  # (B, S)
    tgt_pad = torch.tensor([[False] * 5, [False] * 2 + [True] * 3])  # (B, T)
    return src_pad, tgt_pad


@pytest.mark.parametrize(("placement", "norm_first"), [("post", False), ("pre", True)])
def test_encoder_layer_matches_pytorch(placement, norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(D, H, F_FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    randomize(ref)
    ours = EncoderLayer(cfg(placement)).eval()
    slot = "norm_in" if norm_first else "norm_out"
    copy_attention(ours.self_attn.branch, ref.self_attn)
    copy_ffn_and_norms(ours, ref, [ours.self_attn, ours.ffn], [ref.norm1, ref.norm2], slot)
    src_pad, _ = masks()
    x = torch.randn(2, 7, D)
    with torch.no_grad():
        expected = ref(x, src_key_padding_mask=src_pad)
        got = ours(x, src_pad)
    keep = ~src_pad
    torch.testing.assert_close(got[keep], expected[keep], atol=1e-5, rtol=0)


@pytest.mark.parametrize(("placement", "norm_first"), [("post", False), ("pre", True)])
def test_decoder_layer_matches_pytorch(placement, norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(D, H, F_FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    randomize(ref)
    ours = DecoderLayer(cfg(placement)).eval()
    slot = "norm_in" if norm_first else "norm_out"
    copy_attention(ours.self_attn.branch, ref.self_attn)
    copy_attention(ours.cross_attn.branch, ref.multihead_attn)
    copy_ffn_and_norms(ours, ref, [ours.self_attn, ours.cross_attn, ours.ffn], [ref.norm1, ref.norm2, ref.norm3], slot)
    src_pad, tgt_pad = masks()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 7, D)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True = masked, like the padding masks
    with torch.no_grad():
        expected = ref(x, memory, tgt_mask=causal, tgt_is_causal=True, tgt_key_padding_mask=tgt_pad,
                       memory_key_padding_mask=src_pad)  # fmt: skip
        got = ours(x, memory, src_pad)
    keep = ~tgt_pad
    torch.testing.assert_close(got[keep], expected[keep], atol=1e-5, rtol=0)


def test_pre_ln_stack_matches_pytorch_stack_with_final_norm():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, F_FF, dropout=0.0, batch_first=True, norm_first=True)
    ref = nn.TransformerEncoder(layer, num_layers=2, norm=nn.LayerNorm(D), enable_nested_tensor=False).eval()
    randomize(ref)
    c = cfg("pre")
    model = EncoderDecoder(ModelConfig(**{**c.to_dict(), "n_enc_layers": 2, "norm": c.norm})).eval()
    for ours, theirs in zip(model.encoder, ref.layers, strict=True):
        copy_attention(ours.self_attn.branch, theirs.self_attn)
        copy_ffn_and_norms(ours, theirs, [ours.self_attn, ours.ffn], [theirs.norm1, theirs.norm2], "norm_in")
    model.enc_final_norm.load_state_dict(ref.norm.state_dict())
    src_pad, _ = masks()
    x = torch.randn(2, 7, D)
    with torch.no_grad():
        expected = ref(x, src_key_padding_mask=src_pad)
        got = x
        for layer_ in model.encoder:
            got = layer_(got, src_pad)
        got = model.enc_final_norm(got)
    torch.testing.assert_close(got[~src_pad], expected[~src_pad], atol=1e-5, rtol=0)


def test_the_intended_difference_post_ln_has_no_final_norm():
    assert isinstance(nn.Transformer(D, H, 1, 1, F_FF, batch_first=True, norm_first=False).encoder.norm, nn.LayerNorm)
    model = EncoderDecoder(cfg("post"))
    assert isinstance(model.enc_final_norm, nn.Identity) and isinstance(model.dec_final_norm, nn.Identity)
