"""The encoder-decoder Transformer (Vaswani et al. 2017) with a pluggable norm.

Shape legend: B batch, S src length, T tgt length, D d_model, V tgt vocabulary size.
Token ids are right-padded with ``pad_id``; ``src_pad_mask`` is (B, S) bool, True at padding.
Norms that read the batch (``model.norms.BatchReadingNorm``) also get each stream's keep mask,
True at real tokens: ``~src_pad_mask`` in the encoder, ``tgt_in != pad_id`` in the decoder.
"""

import math

import torch
from torch import nn

from model.attention import KVCache
from model.attn_weights import soft_cap
from model.config import ModelConfig
from model.hyper_connections import HC_MODULES, stream_merge
from model.layers import DecoderLayer, EncoderLayer
from model.norms import BatchReadingNorm
from model.parametrization import logit_factor
from model.placements import PLACEMENTS
from model.weight_norm import apply_weight_norm


def final_norm(cfg: ModelConfig, stack: str, n_layers: int) -> nn.Module:
    """The norm that closes ``stack``, or ``nn.Identity``: the stack's last block decides, by its
    placement record's ``final_norm`` (true iff that block leaves the stream un-normalized), and
    the final norm takes that block's kind, impl, eps and bias, and its ``alpha_init_final`` (dyt, derf)."""
    spec = cfg.block_norm(stack, n_layers - 1)
    return spec.build(cfg.d_model, site="final") if PLACEMENTS[spec.placement].final_norm else nn.Identity()


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """Sinusoidal positions (Vaswani et al. 2017, sec. 3.5): PE[p, 2i] = sin(p / 10000^(2i/D)),
    PE[p, 2i+1] = cos(...). Returns (max_len, D) float32."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: d_model // 2])
    return table


class Embedding(nn.Module):
    """Token embedding * sqrt(D) + positions, then dropout (Vaswani et al. 2017, sec. 3.4-3.5).

    With ``cfg.norm.learned_embed_scale`` the factor sqrt(D) is ``scale``, one learned scalar of this stack
    initialized to sqrt(D): the official DyT LLaMA code's ``shared_scale`` (jiachenzhu/DyT,
    ``other_tasks/LLaMA/fms_fsdp/models/llama.py``) and Derf's GPT-2 patch (zlab-princeton/Derf,
    ``language model/model_derf.patch``), both ``sqrt(emb_dim)`` on the token embeddings (GPT-2: with the
    positions) for their norm-free kinds. Here it scales the tokens only, as the fixed factor does.
    One instance per stack, so telemetry can watch the encoder's and decoder's inputs apart.
    Shapes: (B, L) ids -> (B, L, D); ``start`` is the position of the first id (incremental decoding).
    """

    def __init__(self, vocab: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(vocab, cfg.d_model)
        # a parameter only when learned, so the default model's state dict is what it was
        root_d = math.sqrt(cfg.d_model)
        self.scale = nn.Parameter(torch.tensor([root_d])) if cfg.norm.learned_embed_scale else root_d
        if cfg.positions == "learned":
            self.positions = nn.Embedding(cfg.max_len, cfg.d_model)
        else:
            self.register_buffer("pos_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        end = start + tokens.shape[1]
        if end > self.cfg.max_len:
            raise ValueError(f"sequence of {end} tokens exceeds model.max_len={self.cfg.max_len}")
        table = self.positions.weight if self.cfg.positions == "learned" else self.pos_table
        pos = table[start:end]  # (L, D)
        return self.dropout(self.tokens(tokens) * self.scale + pos)


class DecoderCache:
    """Incremental-decoding state of the whole decoder: per layer, the self-attention cache
    (grows by one position per step) and the cross-attention cache (the memory's keys/values,
    computed once). Shapes (B, H, L, K)."""

    def __init__(self, n_layers: int) -> None:
        self.layers = [(KVCache(), KVCache()) for _ in range(n_layers)]

    def __len__(self) -> int:
        """Target positions decoded so far."""
        return len(self.layers[0][0])

    def select(self, rows: torch.Tensor, *, cross: bool = True) -> None:
        """Keep (and reorder to) batch rows ``rows``. ``cross=False`` leaves the memory's
        keys/values alone: correct when rows only move between copies of the same sentence."""
        for self_cache, cross_cache in self.layers:
            self_cache.select(rows)
            if cross:
                cross_cache.select(rows)


class EncoderDecoder(nn.Module):
    """Encoder-decoder Transformer; each block's norm kind/impl/placement comes from the plan
    ``cfg.block_norm(stack, index)``.

    Module paths are stable across placements (empty norm slots are ``nn.Identity``):
    ``src_embed``, ``encoder.{i}``, ``enc_final_norm``, ``tgt_embed``, ``decoder.{i}``,
    ``dec_final_norm``, ``output``; with ``norm.hc`` also ``enc_streams_merge`` and ``dec_streams_merge``,
    and each residual sublayer's ``hc`` (``model.hyper_connections``), its blocks reading and writing
    (B, L, n*D) streams. With ``cfg.share_embeddings`` (one joint vocabulary) the
    source and target embeddings are one matrix, and with ``cfg.tie_embeddings`` so is the output.

    With ``cfg.weight_norm`` every linear layer of the blocks is ``w = g * v / ||v||`` (``model.weight_norm``):
    its parameters are ``parametrizations.weight.original0`` (g) and ``original1`` (v), not ``weight``.

    ``reads_batch``: some norm of the model reads the batch (``model.norms.BatchReadingNorm``);
    only then are the keep masks computed and passed down, and ``set_norm_group`` has work to do.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        D = cfg.d_model
        self.src_embed = Embedding(cfg.src_vocab, cfg)
        self.tgt_embed = Embedding(cfg.tgt_vocab, cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, i) for i in range(cfg.n_enc_layers))
        self.enc_final_norm = final_norm(cfg, "enc", cfg.n_enc_layers)
        self.decoder = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.n_dec_layers))
        self.dec_final_norm = final_norm(cfg, "dec", cfg.n_dec_layers)
        if cfg.norm.hc is not None:  # hyper-connections: each stack's n streams become one before its final norm
            self.enc_streams_merge = stream_merge(cfg.norm.hc, cfg.residual_streams, D)
            self.dec_streams_merge = stream_merge(cfg.norm.hc, cfg.residual_streams, D)
        self.output = nn.Linear(D, cfg.tgt_vocab, bias=False)
        self.reads_batch = any(isinstance(m, BatchReadingNorm) for m in self.modules())
        self.enc_final_reads = isinstance(self.enc_final_norm, BatchReadingNorm)
        self.dec_final_reads = isinstance(self.dec_final_norm, BatchReadingNorm)
        self._init_weights()
        if cfg.share_embeddings:  # a joint vocabulary: one embedding matrix (Press & Wolf 2017, sec. 5)
            self.src_embed.tokens.weight = self.tgt_embed.tokens.weight
        if cfg.tie_embeddings:  # Press & Wolf 2017; Vaswani et al. sec. 3.4
            self.output.weight = self.tgt_embed.tokens.weight
        if cfg.weight_norm:  # after the init (and its placement rules), so w = g v / ||v|| starts as the init's w
            apply_weight_norm([*self.encoder, *self.decoder])

    def _init_weights(self) -> None:
        # Xavier-uniform matrices and zero biases as in torch.nn.Transformer; embeddings
        # N(0, D^-1/2) so that after the sqrt(D) scale they have unit variance (fairseq).
        # Parameters are drawn in named_parameters() order, then each block's placement init rule
        # (DeepNet's beta-scaled Xavier-normal, T-Fixup's scaling) redraws or scales that block's
        # matrices, in block order.
        for module in self.modules():
            if isinstance(module, HC_MODULES):  # their own init (model.hyper_connections), drawn at construction
                continue
            for p in module.parameters(recurse=False):
                if isinstance(module, nn.Embedding):
                    nn.init.normal_(p, std=self.cfg.d_model**-0.5)
                elif p.dim() == 2:
                    nn.init.xavier_uniform_(p)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        n, m = self.cfg.n_enc_layers, self.cfg.n_dec_layers
        for stack, layers in (("enc", self.encoder), ("dec", self.decoder)):
            for i, layer in enumerate(layers):
                rule = PLACEMENTS[self.cfg.block_norm(stack, i).placement].init
                if rule is not None:
                    rule.apply(layer, stack, n, m)
        # T-Fixup scales the token embeddings too: the record of the stack's first block says by how much.
        for stack, embed in (("enc", self.src_embed), ("dec", self.tgt_embed)):
            scale = PLACEMENTS[self.cfg.block_norm(stack, 0).placement].embed_scale
            if scale is not None:
                with torch.no_grad():
                    embed.tokens.weight.mul_(scale(stack, n, m))
            if self.cfg.width_mult != 1.0 and self.cfg.positions == "learned":  # muP: the base model's std
                with torch.no_grad():
                    embed.positions.weight.mul_(math.sqrt(self.cfg.width_mult))

    def streams(self, x: torch.Tensor) -> torch.Tensor:
        """The embedding (B, L, D) as the blocks' input: itself, or with ``norm.hc`` its n copies (B, L, n*D), the
        streams of hyper-connections (Zhu et al. 2025, sec. 2.1; DeepSeek-V4's expand)."""
        return x if self.cfg.norm.hc is None else x.repeat(1, 1, self.cfg.residual_streams)

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """src (B, S) ids, src_pad_mask (B, S) bool -> memory (B, S, D)."""
        x = self.streams(self.src_embed(src))
        keep = ~src_pad_mask if self.reads_batch else None  # (B, S)
        for layer in self.encoder:
            x = layer(x, src_pad_mask, keep=keep)
        if self.cfg.norm.hc is not None:
            x = self.enc_streams_merge(x)
        return self.enc_final_norm(x, keep) if self.enc_final_reads else self.enc_final_norm(x)

    def decode(
        self, tgt_in: torch.Tensor, memory: torch.Tensor, src_pad_mask: torch.Tensor, cache: DecoderCache | None = None
    ) -> torch.Tensor:
        """tgt_in (B, T) ids, memory (B, S, D), src_pad_mask (B, S) -> logits (B, T, V): times 1 / sqrt(m) under
        ``model.parametrization=mup`` (muP's readout multiplier), then soft-capped to (-c, c) with
        ``model.final_softcap`` c (Gemma 2: c * tanh(logits / c)).

        With ``cache``, ``tgt_in`` holds only the positions after the ``len(cache)`` already
        decoded ones; the cache is updated in place and the logits cover the new positions only.

        Raises:
            RuntimeError: ``cache`` given in training mode while a norm reads the batch: its
                training statistics would be those of the new positions alone.
        """
        if cache is not None and self.training and self.reads_batch:
            raise RuntimeError("incremental decoding with a norm that reads the batch needs model.eval()")
        start = 0 if cache is None else len(cache)
        x = self.streams(self.tgt_embed(tgt_in, start))
        keep = tgt_in.ne(self.cfg.pad_id) if self.reads_batch else None  # (B, T)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, src_pad_mask, None if cache is None else cache.layers[i], keep=keep)
        if self.cfg.norm.hc is not None:
            x = self.dec_streams_merge(x)
        logits = self.output(self.dec_final_norm(x, keep) if self.dec_final_reads else self.dec_final_norm(x))
        if self.cfg.width_mult != 1.0:  # muP's readout multiplier (model.parametrization)
            logits = logits * logit_factor(self.cfg.width_mult)
        return logits if self.cfg.final_softcap is None else soft_cap(logits, self.cfg.final_softcap)  # Gemma 2

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S) ids, tgt_in (B, T) ids (BOS-shifted target) -> logits (B, T, V)."""
        src_pad_mask = src.eq(self.cfg.pad_id)  # (B, S)
        return self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask)

    def parameter_counts(self) -> dict[str, int]:
        """``{"total": N, "hc": M}``: the model's parameter entries, a tied or shared matrix counted once
        (``nn.Module.parameters`` yields a shared tensor once: with ``tie_embeddings`` the output projection is the
        target embedding), and of them the hyper-connections' (``HC_MODULES``; 0 without ``norm.hc``), the
        parameters they add over the same model with one plain residual stream."""
        hc = {id(p): p.numel() for m in self.modules() if isinstance(m, HC_MODULES) for p in m.parameters()}
        return {"total": sum(p.numel() for p in self.parameters()), "hc": sum(hc.values())}

    def set_norm_group(self, group: torch.distributed.ProcessGroup | None) -> None:
        """Have every norm that reads the batch sum its statistics over ``group``, the data-parallel
        process group (None: this process only). Token-wise norms have no statistics to share."""
        for module in self.modules():
            if isinstance(module, BatchReadingNorm):
                module.group = group

    def compile_layers(self) -> None:
        """``torch.compile`` each encoder and decoder layer: small graphs, quick to compile, module
        names unchanged (decoding and telemetry's extra pass run them eagerly).

        Compiled random ops use ATen's generator (inductor's ``fallback_random``) instead of
        inductor's own Philox stream, so compiled layers draw the same dropout masks as eager
        ones and advance the generator alike: the eager pass telemetry records from sees the
        training pass's masks (telemetry/__init__.py), and compiled and eager runs of one seed
        train alike.
        """
        for layer in [*self.encoder, *self.decoder]:
            layer.compile(options={"fallback_random": True})
