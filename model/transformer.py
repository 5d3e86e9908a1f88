"""The encoder-decoder Transformer (Vaswani et al. 2017) with a pluggable norm.

Shape legend: B batch, S src length, T tgt length, D d_model, V tgt vocabulary size.
Token ids are right-padded with ``pad_id``; ``src_pad_mask`` is (B, S) bool, True at padding.
"""

import math

import torch
from torch import nn

from model.config import ModelConfig
from model.layers import DecoderLayer, EncoderLayer
from model.residual import build_final_norm, deepnorm_constants

# DeepNet (Wang et al. 2022, Fig. 2) scales the init of these matrices by beta.
DEEPNORM_SCALED = ("v_proj.weight", "out_proj.weight", "linear1.weight", "linear2.weight")


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

    One instance per stack, so telemetry can watch the encoder's and decoder's inputs apart.
    Shapes: (B, L) ids -> (B, L, D).
    """

    def __init__(self, vocab: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(vocab, cfg.d_model)
        if cfg.positions == "learned":
            self.positions = nn.Embedding(cfg.max_len, cfg.d_model)
        else:
            self.register_buffer("pos_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        L = tokens.shape[1]
        if L > self.cfg.max_len:
            raise ValueError(f"sequence of {L} tokens exceeds model.max_len={self.cfg.max_len}")
        pos = self.positions.weight[:L] if self.cfg.positions == "learned" else self.pos_table[:L]  # (L, D)
        return self.dropout(self.tokens(tokens) * math.sqrt(self.cfg.d_model) + pos)


class EncoderDecoder(nn.Module):
    """Encoder-decoder Transformer; norm kind/impl/placement come from ``cfg.norm``.

    Module paths are stable across placements (empty norm slots are ``nn.Identity``):
    ``src_embed``, ``encoder.{i}``, ``enc_final_norm``, ``tgt_embed``, ``decoder.{i}``,
    ``dec_final_norm``, ``output``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        D = cfg.d_model
        self.src_embed = Embedding(cfg.src_vocab, cfg)
        self.tgt_embed = Embedding(cfg.tgt_vocab, cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc_layers))
        self.enc_final_norm = build_final_norm(cfg.norm, D)
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec_layers))
        self.dec_final_norm = build_final_norm(cfg.norm, D)
        self.output = nn.Linear(D, cfg.tgt_vocab, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:  # Press & Wolf 2017; Vaswani et al. sec. 3.4
            self.output.weight = self.tgt_embed.tokens.weight

    def _init_weights(self) -> None:
        # Xavier-uniform matrices and zero biases as in torch.nn.Transformer; embeddings
        # N(0, D^-1/2) so that after the sqrt(D) scale they have unit variance (fairseq).
        for name, p in self.named_parameters():
            if "embed" in name:
                nn.init.normal_(p, std=self.cfg.d_model**-0.5)
            elif p.dim() == 2:
                nn.init.xavier_uniform_(p)
            elif name.endswith(("proj.bias", "linear1.bias", "linear2.bias")):
                nn.init.zeros_(p)
        if self.cfg.norm.placement == "deepnorm":  # the paper's pseudocode: xavier_normal_(w, gain=beta or 1)
            betas = deepnorm_constants(self.cfg.n_enc_layers, self.cfg.n_dec_layers)
            for stack, layers in (("enc", self.encoder), ("dec", self.decoder)):
                for name, p in layers.named_parameters():
                    if p.dim() == 2:
                        nn.init.xavier_normal_(p, gain=betas[stack][1] if name.endswith(DEEPNORM_SCALED) else 1.0)

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """src (B, S) ids, src_pad_mask (B, S) bool -> memory (B, S, D)."""
        x = self.src_embed(src)
        for layer in self.encoder:
            x = layer(x, src_pad_mask)
        return self.enc_final_norm(x)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """tgt_in (B, T) ids, memory (B, S, D), src_pad_mask (B, S) -> logits (B, T, V)."""
        x = self.tgt_embed(tgt_in)
        for layer in self.decoder:
            x = layer(x, memory, src_pad_mask)
        return self.output(self.dec_final_norm(x))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S) ids, tgt_in (B, T) ids (BOS-shifted target) -> logits (B, T, V)."""
        src_pad_mask = src.eq(self.cfg.pad_id)  # (B, S)
        return self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask)

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int) -> torch.Tensor:
        """Greedy decoding: at each step append the argmax token, until every row has EOS.

        Args:
            src: (B, S) ids.
            bos_id, eos_id: ids of the begin/end-of-sequence tokens in the target vocabulary.
            max_len: most tokens generated per row (EOS included); at most ``cfg.max_len - 1``.

        Returns:
            (B, L) generated ids without the BOS, L <= max_len; rows that ended early are
            filled with ``pad_id`` after their EOS.
        """
        max_len = min(max_len, self.cfg.max_len - 1)
        src_pad_mask = src.eq(self.cfg.pad_id)
        memory = self.encode(src, src_pad_mask)  # (B, S, D)
        ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            next_tok = self.decode(ys, memory, src_pad_mask)[:, -1].argmax(-1)  # (B,)
            next_tok = next_tok.masked_fill(done, self.cfg.pad_id)
            ys = torch.cat([ys, next_tok[:, None]], dim=1)  # (B, t + 1)
            done |= next_tok.eq(eos_id)
            if bool(done.all()):
                break
        return ys[:, 1:]
