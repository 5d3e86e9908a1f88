"""What the tests of model.parametrization=mup and completep share: a small model's config, one training step, and
the norm of every preset and kind."""

import torch
import torch.nn.functional as F

from model.config import ModelConfig
from model.kinds import BATCH_READING_KINDS
from model.norm_config import NormConfig
from model.transformer import EncoderDecoder
from tests.helpers.config import compose_conf, model_config, presets
from training.optim import build_optimizer
from training.presets import default_optim

NORM_PRESETS = [p for p in presets() if p.startswith("norm=")]


def vocab(**kw) -> ModelConfig:
    """A ``ModelConfig`` of ``kw`` with a source vocabulary of 30 and a target one of 40."""
    return ModelConfig(src_vocab=30, tgt_vocab=40, **kw)


def step(cfg: ModelConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The logits of a fixed batch, and the weights after one AdamW step on it, of ``cfg``'s model seeded 0."""
    torch.manual_seed(0)
    model = EncoderDecoder(cfg)
    src, tgt = torch.randint(1, 30, (3, 7)), torch.randint(1, 40, (3, 6))
    logits = model(src, tgt)
    opt = build_optimizer(model, default_optim(lr=1e-2, weight_decay=0.1))
    F.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
    opt.step()
    return logits.detach(), {k: v.detach().clone() for k, v in model.state_dict().items()}


def init_logits(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (32, 12, vocab), tgt_in (32, 12)) of ``cfg``'s model at initialization (seed 0) on one fixed batch."""
    gen = torch.Generator().manual_seed(0)
    src, tgt_in = torch.randint(3, 30, (32, 12), generator=gen), torch.randint(3, 40, (32, 12), generator=gen)
    torch.manual_seed(0)
    with torch.no_grad():
        return EncoderDecoder(cfg).eval()(src, tgt_in), tgt_in


def norm_of(case: str) -> NormConfig:
    """A norm preset's ``norm`` (``norm=olmo2``), or ``norm.kind=K`` on the default one."""
    overrides = [case] if case.startswith("norm=") else [f"norm.kind={case}"]
    if case in BATCH_READING_KINDS:  # their decoder blocks read the batch only where the user allows it
        overrides.append("norm.decoder_batch_stats=true")
    return model_config(compose_conf("model=tiny", *overrides), 30, 40).norm
