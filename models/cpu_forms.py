"""The forms a float32 product can take in an eager CPU step, and which one each row count takes.

A decode or verify step on CPU is weight reads, and how fast the library's kernels read them
depends on the processor: F.linear (x @ W.T) is the default;
`few_rows_cpu` (W @ x.T) and `onednn_linear` (oneDNN over a weight reordered once into its blocked
layout) are faster on some processors at some row counts. models/cpu_products.py times them on this
machine and the engine puts its choice in the models' KernelPlan (models/kernel_plan.py) at load. All
three give F.linear's products up to float32 rounding. A compiled step takes the same form where its
row count is fixed (calling oneDNN as one opaque op, `specserve::onednn_linear`); where the count is
symbolic, oneDNN if F.linear lost at every count (CpuForms.compiled), else inductor's own products,
F.linear's.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils.weak import WeakIdKeyDictionary

CPU_FEW_ROWS = 8  # the most rows few_rows_cpu is offered for


@dataclass(frozen=True)
class CpuForms:
    """The form ("linear", "few_rows" or "onednn") each row count takes, from (row count, form)
    pairs measured on this processor, ascending. A count between two measured ones takes the
    larger's form, a count past the largest (a prefill) the largest's; none measured: F.linear."""
    measured: tuple[tuple[int, str], ...] = ()
    # The one form of compiled steps, whose row count may be symbolic: oneDNN where F.linear lost at
    # every count and oneDNN won at some (W @ x.T, which may win a few counts by a hair, has no
    # compiled form), else F.linear, inductor's own product. A field, so tracing reads a constant.
    compiled: str = field(init=False, default="linear")

    def __post_init__(self):
        forms = {form for _, form in self.measured}
        if "onednn" in forms and "linear" not in forms:
            object.__setattr__(self, "compiled", "onednn")

    @property
    def takes_onednn(self) -> bool:
        return any(form == "onednn" for _, form in self.measured)

    def form(self, rows: int | torch.SymInt) -> str:
        """The form of a product of `rows` rows. Compiled, the count may be symbolic (a prefill's width,
        a dynamic batch), and comparing it would specialize the compile to each count: there only a
        count known to be a measured one without a guard (a batch-1 step's) takes its form, any other
        `compiled`."""
        if not self.measured:
            return "linear"
        if torch.compiler.is_compiling():
            return next((form for n, form in self.measured if statically_known_true(rows == n)), self.compiled)
        i = bisect.bisect_left(self.measured, (rows,))
        return self.measured[min(i, len(self.measured) - 1)][1]


def few_rows_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for up to CPU_FEW_ROWS float32 rows on CPU, as weight @ x.T (1 or 3 rows padded
    by one).

    On some CPUs (an AMD EPYC VM) float32 `x @ W.T` for 2-8 rows costs up to three times one row
    (the library repacks the weight) while `W @ x.T` reads the weight once, fastest for an even
    count of 2 or 4 columns (one column takes a matrix-vector kernel, three a slower tile). On
    others (an Intel Xeon VM) it is 2-2.5x slower than F.linear."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    n = rows.shape[0]
    if n in (1, 3):
        rows = torch.cat([rows, rows[:1]])
    y = torch.mm(weight, rows.t())[:, :n].t().contiguous()
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


# weight -> (its version counter when reordered, the reordered copy); an entry goes with its weight.
_REORDERED: WeakIdKeyDictionary = WeakIdKeyDictionary()
# The row count oneDNN lays the weight out for: on an AMD EPYC VM one layout for 8 rows ran
# SmolLM2's products 2.1-4.0x faster than F.linear at every count from 1 to 512.
REORDER_ROWS = 8


def onednn_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` reordered into oneDNN's blocked layout (torch's CPU ops for it, private:
    torch.ops.mkldnn), made on first use and again after the weight changes in place (a training
    step, a loaded state dict); it doubles the weight's memory (an inference tensor keeps no version
    counter: its first copy stays)."""
    version = None if weight.is_inference() else weight._version
    kept = _REORDERED.get(weight)
    if kept is None or kept[0] != version:
        kept = (version, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), REORDER_ROWS))
        _REORDERED[weight] = kept
    return kept[1]


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear through oneDNN over `weight`'s reordered copy (onednn_weight). No autograd: callers
    use it without gradients."""
    return torch.ops.mkldnn._linear_pointwise(x, onednn_weight(weight), bias, "none", [], "")


# onednn_linear as one opaque op for compiled steps: torch.compile calls it with the step's tensors and
# does not trace its cache of reordered weights. Defined through torch.library.Library, whose calls
# cost less than torch.library.custom_op's (5.5 against 15 us a call), and a step makes about 150 of
# them. Inductor cannot take oneDNN's own op: its
# lowering wants the weights frozen.
_LIBRARY = torch.library.Library("specserve", "DEF")
_LIBRARY.define("onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_LIBRARY.impl("onednn_linear", onednn_linear, "CPU")


@torch.library.register_fake("specserve::onednn_linear")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
