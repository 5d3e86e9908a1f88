"""Model FLOPs of a training step and model FLOPs utilisation (MFU).

Counting follows Hoffmann et al. 2022 (Chinchilla), Appendix F: matrix multiplications only,
2 FLOPs per multiply-accumulate, backward = 2 x forward, so a training step costs 3 x the
forward FLOPs. Embedding lookups, norms, softmax and biases are left out (< 1 % here); the
causal self-attention scores are counted in full, as in PaLM (Chowdhery et al. 2022, App. B).
Padded positions count: the hardware computes them.

Forward FLOPs for a batch of B rows, S src and T tgt positions, D = d_model, F = d_ff,
V = tgt vocabulary, L_e / L_d layers:

    encoder, per src token and layer:  2 (4 D^2 + 2 D F)  +  4 S D           (projections, FFN; QK^T and AV)
    decoder, per tgt token and layer:  2 (6 D^2 + 2 D F)  +  4 T D  +  4 S D  (self q/k/v/out, cross q/out, FFN; scores)
    decoder, per src token and layer:  2 (2 D^2)                             (cross-attention k/v of memory)
    output layer, per tgt token:       2 D V

With hyper-connections (``norm.hc``, n = ``model.residual_streams`` streams; ``model.hyper_connections``),
per token of each sublayer (2 per encoder layer at the S src tokens, 3 per decoder layer at the T tgt tokens),
forward:

    static:   2 n (n+1) D                       ([a_m | A]^T H: h0 and the n mixed streams)
    dynamic:  2 n (n+1) D + 2 n (n+1) D + 2 n D  (the same, LN(H) W_a, LN(H) W_b)
    mhc:      2 n^2 (n+2) D + 2 n^2 D            (x' phi^T, A^T H)

and mhc's head, per token at each stack's end: 2 n^2 D (x' phi_head^T); the static and dynamic merge is a sum.
Sinkhorn, the sigmoids, the gating products and mHC's weighted sums sum_k a_m[k] H_k (its sublayers' and its
head's, run as a product and a sum) are elementwise, left out as the norms are: at most 2 n D per token each.

MFU = model FLOPs per second / the device's peak dense bf16 FLOP/s (PaLM, App. B).

``counted_train_flops`` counts the same step with ``torch.utils.flop_counter.FlopCounterMode`` instead
(every matmul, bmm, matrix-vector product and attention kernel that runs, 2 FLOPs per multiply-accumulate): the
formula's check, and the count ``scripts/estimate_time.py`` plans GPU runs with. The one matmul FLOP the counter
cannot see is the input gradient of dynamic HC's LN(H) W_b, an outer product it takes for an elementwise product:
it counts 2 n D per token and sublayer fewer than the formula's 2 x forward there.
"""

from contextlib import nullcontext

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from data.batching import Batch
from model.config import ModelConfig
from training.step import StepOptions, token_losses

# Dense bf16 peak FLOP/s from the vendors' data sheets (SXM parts; a sheet's "with sparsity" figure halved, e.g.
# the H200's 1,979 TFLOPS); matched against the CUDA device name.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}


def train_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
    """Model FLOPs of one forward + backward pass over a (batch, src_len) / (batch, tgt_len) batch, the
    hyper-connections' matmuls included (module docstring)."""
    D, F, S, T = cfg.d_model, cfg.d_ff, src_len, tgt_len
    enc = cfg.n_enc_layers * batch * S * (2 * (4 * D * D + 2 * D * F) + 4 * S * D)
    dec = cfg.n_dec_layers * batch * (T * (2 * (6 * D * D + 2 * D * F) + 4 * T * D + 4 * S * D) + S * 2 * 2 * D * D)
    out = batch * T * 2 * D * cfg.tgt_vocab
    return 3.0 * (enc + dec + out + hyper_connection_flops(cfg, batch, src_len, tgt_len))


def hyper_connection_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Forward FLOPs of the hyper-connections (``cfg.norm.hc``) over the batch's (batch, src_len) / (batch,
    tgt_len) tokens: every sublayer's mixing weights and mixing, and mhc's two heads (module docstring); 0 without."""
    n, D, kind = cfg.residual_streams, cfg.d_model, cfg.norm.hc
    if kind is None or n is None:  # (ModelConfig gives hyper-connections their streams)
        return 0
    per_sublayer = {
        "static": 2 * n * (n + 1) * D,
        "dynamic": 2 * 2 * n * (n + 1) * D + 2 * n * D,
        "mhc": 2 * n * n * (n + 2) * D + 2 * n * n * D,
    }[kind]
    head = 2 * n * n * D if kind == "mhc" else 0
    sublayer_tokens = batch * (2 * cfg.n_enc_layers * src_len + 3 * cfg.n_dec_layers * tgt_len)
    return per_sublayer * sublayer_tokens + head * batch * (src_len + tgt_len)


def _mv_flop(a_shape: tuple[int, int], b_shape: tuple[int], *args, out_shape=None, **kwargs) -> int:
    """FLOPs of a matrix-vector product (m, k) @ (k,), 2 per multiply-accumulate as the counter's ``mm``."""
    return 2 * a_shape[0] * a_shape[1]


def flop_counter() -> FlopCounterMode:
    """torch's ``FlopCounterMode`` (no display) that also counts ``aten.mv``, which it leaves out by default:
    dynamic HC's LN(H) W_b and its weight gradient run as one."""
    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.mv: _mv_flop})


def counted_train_flops(model: nn.Module, micro: list[Batch], label_smoothing: float, z_loss: float = 0.0) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs of one training step over the micro-batches ``micro`` (src (B, S),
    tgt_in / tgt_out (B, T) each), as ``torch.utils.flop_counter.FlopCounterMode`` counts them: the model's
    forward, the loss of ``training.step.token_losses`` and its backward, as ``training.step.train_step`` runs
    them. The optimizer update, norms and softmax are elementwise, which the counter leaves out, as the formula
    does. Attention runs on SDPA's math backend, as matmuls the counter sees on any device (the fused CPU kernel
    it does not see). On the meta device (model and batches) nothing is computed, so a GPU-sized step counts in
    seconds; a model whose forward depends on values (batch-reading norms' masked statistics) cannot run there.

    Raises:
        NotImplementedError / RuntimeError: on the meta device, a model that cannot run there.
    """
    options = StepOptions(world=1, label_smoothing=label_smoothing, grad_clip=None, autocast=nullcontext(), z_loss=z_loss)
    forward = 0
    with sdpa_kernel(SDPBackend.MATH), flop_counter() as counter:
        for batch in micro:
            before = counter.get_total_flops()
            ce, z = token_losses(model(batch.src, batch.tgt_in), batch.tgt_out, options)
            forward += counter.get_total_flops() - before
            (ce if z is None else ce + z).backward()
    return forward, counter.get_total_flops()


def peak_flops(device: torch.device, peak_tflops: float | None) -> float | None:
    """Peak FLOP/s for MFU: ``peak_tflops`` (config) if given, else the table entry for a known
    CUDA device, else None (MFU is then not logged, e.g. on CPU)."""
    if peak_tflops is not None:
        return peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
