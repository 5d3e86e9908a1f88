"""A padded batch for the norms that read the batch (BatchNorm, PowerNorm), with noise in its padding."""

import torch
from torch import nn

from model.transformer import EncoderDecoder

PAD, BOS, EOS, V, D = 0, 1, 2, 12, 16


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """src (4, 7) and tgt_in (4, 6), right-padded with PAD to different lengths in each row."""
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(4, V, (4, 7), generator=g), torch.randint(4, V, (4, 6), generator=g)
    tgt[:, 0] = BOS
    for row, (s, t) in enumerate([(7, 6), (3, 2), (5, 4), (2, 5)]):
        src[row, s:], tgt[row, t:] = PAD, PAD
    return src, tgt


def noisy_padding(model: EncoderDecoder, src: torch.Tensor, tgt: torch.Tensor, seed: int) -> torch.Tensor:
    """The logits (B, T, V) with random values written into the embeddings at every padded position,
    the masks (from the ids) unchanged."""
    g = torch.Generator().manual_seed(seed)
    pads = {model.src_embed: src.eq(PAD), model.tgt_embed: tgt.eq(PAD)}

    def fill(mod: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        noise = 10 * torch.randn(out.shape, generator=g)
        return torch.where(pads[mod][..., None], noise, out)

    handles = [embed.register_forward_hook(fill) for embed in pads]
    try:
        return model(src, tgt)
    finally:
        for h in handles:
            h.remove()
