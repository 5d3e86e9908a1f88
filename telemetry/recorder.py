"""Telemetry: per-layer activation scale, attention, output-logit, gradient, weight, scale and optimizer
statistics of a training step, reduced on the device.

One module per thing observed, each writing 0-dim device tensors into one shared record:
``activations`` (``act/``), ``attention`` (``attn/``), ``batch_stats`` (``bstat/``), ``hyper_connections``
(``hc/``), ``logits`` (``out/``),
``parameters`` (``grad/``, ``weight/``, ``scale/``) and ``optimizer`` (``update/``, ``optim/below_eps``); ``config`` holds
:class:`TelemetryConfig`. Names are formatted and parsed only by ``runlog/metric_names.py``; definitions,
sources and Gaussian baselines: docs/telemetry.md.

:class:`Telemetry` composes them. The training step calls it at three named points, each a no-op when
the step does not record: :meth:`Telemetry.around_forward` (the first micro-batch's forward pass: its
activations, attention logits and output logits), :meth:`Telemetry.after_backward` (gradients before
clipping, parameters before the update) and :meth:`Telemetry.around_update` (the update, and AdamW's
state after it); :meth:`Telemetry.collect` then moves the record to the host in one transfer.

Cost: hooks exist only inside :meth:`Telemetry.watch`, so steps that do not record pay nothing.
Telemetry never changes a training trajectory, eager or compiled: losses and weights are
bit-identical with it on or off. Hooks only read tensors (under ``no_grad``), and with compiled
layers they run in a separate eager, no-grad forward pass with the RNG state restored after it,
so that the training pass stays compiled (:meth:`Telemetry.around_forward`; docs/telemetry.md,
"Telemetry and torch.compile").
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

import torch

from model.batch_reading import buffers_kept
from model.transformer import EncoderDecoder
from telemetry.activations import ActivationStats
from telemetry.attention import AttentionStats
from telemetry.batch_stats import BatchStats
from telemetry.config import TelemetryConfig
from telemetry.core import DeviceStats
from telemetry.hyper_connections import HyperConnectionStats
from telemetry.logits import LogitStats
from telemetry.optimizer import OptimizerStats
from telemetry.parameters import ParameterStats


class ForwardInputs(Protocol):
    """What :meth:`Telemetry.around_forward` reads of a batch (``data.batching.Batch`` has it)."""

    src: torch.Tensor  # (B, S) source ids
    tgt_in: torch.Tensor  # (B, T) decoder input ids

    @property
    def src_pad_mask(self) -> torch.Tensor: ...  # (B, S) bool, True at src padding

    @property
    def tgt_pad_mask(self) -> torch.Tensor: ...  # (B, T) bool, True at tgt padding


class Telemetry:
    """Collects the configured statistics of one training step; see the module docstring."""

    def __init__(self, model: EncoderDecoder, cfg: TelemetryConfig) -> None:
        self.model = model
        self.cfg = cfg
        self.stats: DeviceStats = {}  # everything but the activations' raw sums, in recording order
        self.activations = ActivationStats(model, cfg)
        self.attention = AttentionStats(model, cfg, self.stats)
        self.batch_stats = BatchStats(model, cfg, self.stats)
        self.hyper_connections = HyperConnectionStats(model, self.stats)
        self.logits = LogitStats(cfg, self.stats)
        self.parameters = ParameterStats(model, cfg, self.stats)
        self.optimizer = OptimizerStats(model, cfg, self.stats)

    def due(self, step: int, max_steps: int) -> bool:
        """Whether step ``step`` (1-based) records: the first step (the profile at
        initialization), every ``cfg.every`` steps, and the last; never when every = 0."""
        return self.cfg.every > 0 and (step == 1 or step % self.cfg.every == 0 or step == max_steps)

    @contextmanager
    def watch(self, src_pad_mask: torch.Tensor, tgt_pad_mask: torch.Tensor) -> Iterator[None]:
        """Record activation statistics (and attention entropy and max logit, and batch-reading norms' ``bstat/``)
        of the forward passes inside.

        Args:
            src_pad_mask: (B, S) bool, True at src padding; excluded from encoder statistics and
                from the keys/values of the decoder's cross-attention.
            tgt_pad_mask: (B, T) bool, True at tgt padding; excluded from decoder statistics.
        """
        masks = (src_pad_mask, tgt_pad_mask)
        handles = self.activations.hooks(*masks) + self.attention.hooks(*masks) + self.batch_stats.hooks()
        handles += self.hyper_connections.hooks(*masks)
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextmanager
    def around_forward(self, batch: ForwardInputs, record: bool) -> Iterator[None]:
        """Around the training forward pass ``model(batch.src, batch.tgt_in)``: with ``record``, its
        activation, attention and batch-statistics (``bstat/``) statistics and its output logits (``out/``);
        nothing otherwise.

        Eager model: hooks on that very pass (:meth:`watch`). Compiled model: on entry, one extra
        eager forward pass over the same inputs, under ``no_grad`` and with the CPU and device RNG
        states restored after it (``torch.random.fork_rng``), carries the hooks; the training pass
        inside then runs exactly as on a step without telemetry. The extra pass runs in training mode
        and would update a batch-reading norm's running statistics a second time: every buffer is
        restored after it (so its ``bstat/`` pre-hooks read the buffers the training pass starts from).
        It draws the training pass's dropout masks when compiled random ops use ATen's generator
        (``compile_layers`` does so). Either way the output logits are the training pass's, read by a hook on the model's output.
        """
        if not record:
            yield
            return
        watching: AbstractContextManager[None] = self.watch(batch.src_pad_mask, batch.tgt_pad_mask)
        if self._compiled():
            device = batch.src.device  # fork_rng restores the CPU generator, and those of the devices listed
            forked = torch.random.fork_rng([] if device.type == "cpu" else [device], device_type=device.type)
            with forked, torch.no_grad(), torch.compiler.set_stance("force_eager"), watching, buffers_kept(self.model):
                self.model(batch.src, batch.tgt_in)
            watching = nullcontext()
        with watching, self._output_logits(batch.tgt_pad_mask):
            yield

    @contextmanager
    def _output_logits(self, tgt_pad_mask: torch.Tensor) -> Iterator[None]:
        """Record ``out/`` from the output logits (B, T, V) of the model's forward passes inside."""
        handle = self.model.register_forward_hook(lambda mod, args, out: self.logits.record(out, tgt_pad_mask))
        try:
            yield
        finally:
            handle.remove()

    def _compiled(self) -> bool:
        """Whether any module of the model runs compiled code (``nn.Module.compile``, as
        :meth:`EncoderDecoder.compile_layers` does)."""
        # nn.Module.compile stores the compiled call here; there is no public accessor.
        return any(getattr(m, "_compiled_call_impl", None) is not None for m in self.model.modules())

    def after_backward(self, record: bool) -> None:
        """After the last backward pass, before clipping and the update: with ``record``, gradient norms,
        weight spectra and learned scales."""
        if record:
            self.parameters.record_grad_norms()
            self.parameters.record()

    @contextmanager
    def around_update(self, opt: torch.optim.Optimizer, record: bool) -> Iterator[None]:
        """Around ``opt.step()``: with ``record``, the update ratios, and AdamW's state after the step."""
        if not record:
            yield
            return
        with self.optimizer.watch_update():
            yield
        self.optimizer.record_adam(opt)

    def collect(self) -> dict[str, float]:
        """All recorded statistics as Python floats (one device-to-host transfer), then reset.

        Activation metrics come first, in forward order (embeddings, block 0 in, ..., final
        norm), so the first non-finite one is where a diverging run first went wrong (see
        :func:`first_nonfinite`); the rest follow in recording order.
        """
        named = [*self.activations.raw(), *self.stats.items()]
        if not named:
            return {}
        values = torch.stack([t.float() for _, t in named]).tolist()  # the one transfer
        host = dict(zip((name for name, _ in named), values, strict=True))
        out = self.activations.derive(host)
        out.update({name: host[name] for name in self.stats})
        self.stats.clear()
        return out

    def state_dict(self) -> dict:
        """What a checkpoint carries: :meth:`ParameterStats.state_dict` (the power-iteration vectors)."""
        return self.parameters.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`."""
        self.parameters.load_state_dict(state)
