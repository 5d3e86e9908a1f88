"""Where a training step's time goes: ``torch.profiler`` events of :func:`training.step.train_step`, summed by category.

Each profiled op's *self* CPU time (its time less its children's, on the calling thread: intra-op threads work
inside the op that forks them) goes to one category of ``CATEGORIES``. An op is placed by what it is
(``MATMUL_OPS``, ``DROPOUT_OPS``, ...) and by the innermost labelled range around it: the norm and dropout
modules' forward passes (labelled by :func:`label_modules`), ``scaled_dot_product_attention`` and the
cross-entropy, the optimizer's ``Optimizer.step``/``zero_grad`` ranges and ``train_step``'s ``normlab::clip``.
A backward op is placed by the forward op that created its autograd node: the backward node's
``autograd::engine::evaluate_function`` event carries that op's ``sequence_nr`` (``FunctionEvent``), the link
torch's own ``EventList._set_backward_stacktraces`` follows. So a custom norm's backward ``mul`` counts as norm
time, and the math path's ``bmm`` inside attention counts as attention, forward and backward.

``host`` is the profiled steps' wall time less every op's self time: Python, module dispatch and the profiler's
own cost between ops.
"""

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn
from torch.autograd import profiler
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile

# Printed in this order; every op's self time lands in exactly one.
CATEGORIES = ("matmul", "attention", "norms", "dropout", "softmax/CE", "optimizer", "other ops", "host")
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
DROPOUT_OPS = {"aten::bernoulli_", "aten::dropout", "aten::native_dropout", "aten::native_dropout_backward"}
# Ranges (an enclosing event's name, or its prefix) that claim the ops inside them, forward and backward.
RANGES = {
    "aten::scaled_dot_product_attention": "attention",
    "normlab::norm": "norms",
    "normlab::dropout": "dropout",
    "aten::dropout": "dropout",
    "aten::cross_entropy_loss": "softmax/CE",
    "aten::log_softmax": "softmax/CE",
    "Optimizer.step": "optimizer",
    "Optimizer.zero_grad": "optimizer",
    "normlab::clip": "optimizer",
}
# The attribute names of the model's norm slots (``model.residual``, ``model.attention``, ``model.transformer``).
NORM_SLOTS = {"norm_in", "norm_branch", "norm_out", "enc_final_norm", "dec_final_norm", "q_norm", "k_norm", "v_norm"}
BACKWARD = "autograd::engine::evaluate_function: "


@contextmanager
def label_modules(model: nn.Module) -> Iterator[None]:
    """Wrap the forward pass of every norm slot (``NORM_SLOTS``, not ``nn.Identity``) and every ``nn.Dropout``
    of ``model`` in a profiler range, ``normlab::norm`` or ``normlab::dropout``, while the context is open."""
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout):
            label = "normlab::dropout"
        elif name.rsplit(".", 1)[-1] in NORM_SLOTS and not isinstance(module, nn.Identity):
            label = "normlab::norm"
        else:
            continue
        ranges: list[profiler.record_function] = []

        def enter(_module, _args, label=label, ranges=ranges) -> None:
            ranges.append(profiler.record_function(label))
            ranges[-1].__enter__()

        def leave(_module, _args, _out, ranges=ranges) -> None:
            ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def range_category(event) -> str | None:
    """The category of the innermost range of ``RANGES`` that holds ``event`` (itself included), or None."""
    while event is not None:
        for prefix, category in RANGES.items():
            if event.name.startswith(prefix):
                return category
        event = event.cpu_parent
    return None


def op_category(name: str, context: str | None) -> str:
    """The category of an op called ``name`` inside a range of category ``context`` (None: none)."""
    if context in ("attention", "optimizer"):  # the math path's bmm is attention; clip's norms are the optimizer's
        return context
    if name in MATMUL_OPS:
        return "matmul"
    if name in DROPOUT_OPS:
        return "dropout"
    return context or "other ops"


def event_categories(events) -> Iterator[tuple[FunctionEvent, str]]:
    """Each event of a profiler's ``events()`` with its category of ``CATEGORIES`` (never ``host``). A backward
    op takes the category of the range that held the forward op of its autograd node."""
    forward: dict[int, str | None] = {}  # sequence_nr of a forward op -> its range's category
    for e in events:
        if e.sequence_nr >= 0 and in_forward(e):
            forward.setdefault(e.sequence_nr, range_category(e))
    for e in events:
        node = e
        while node is not None and not node.name.startswith(BACKWARD):
            node = node.cpu_parent
        context = range_category(e)
        if node is not None and context is None:
            context = forward.get(node.sequence_nr)
        yield e, op_category(e.name, context)


def categorize(events) -> defaultdict[str, float]:
    """Self CPU time in microseconds per category (``event_categories``) of a profiler's ``events()``."""
    totals: defaultdict[str, float] = defaultdict(float)
    for e, category in event_categories(events):
        totals[category] += e.self_cpu_time_total
    return totals


def in_forward(event) -> bool:
    """Whether ``event`` runs outside the autograd engine's backward pass."""
    while event is not None:
        if event.name.startswith(BACKWARD):
            return False
        event = event.cpu_parent
    return True


def profile_steps(model: nn.Module, step: Callable[[], None], warmup: int, steps: int) -> dict[str, float]:
    """Run ``step`` (one training step of ``model``) ``warmup`` times, then ``steps`` times under the profiler.

    Returns:
        The share of the profiled steps' wall time per category of ``CATEGORIES`` (fractions summing to 1; ``host``:
        the time no op accounts for), and ``step_s``: the mean wall time of a profiled step in seconds.
    """
    for _ in range(warmup):
        step()
    with label_modules(model), profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall_us = (time.perf_counter() - start) * 1e6
    totals = categorize(prof.events())
    totals["host"] = max(wall_us - sum(totals.values()), 0.0)
    shares = {c: totals[c] / wall_us for c in CATEGORIES}
    return shares | {"step_s": wall_us / 1e6 / steps}
