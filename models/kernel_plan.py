"""The kernel choices a model's layers read (models/layers.py): one plan a model holds, set when the
engine loads it (and the CPU product forms again once measured while serving, between two steps)."""
from __future__ import annotations

from dataclasses import dataclass, field

from models.cpu_forms import CpuForms

ATTENTION_FORMS = ("auto", "sdpa", "written_out")


@dataclass(frozen=True)
class KernelPlan:
    """`attention`: "sdpa" always; "auto" writes attention out (models.layers.written_out_attention)
    in compiled CUDA steps of few queries; "written_out" always. `gemv_as_reduction`: a compiled
    one-token CUDA product as one reduction kernel (models.layers.gemv_reduction). `cpu_forms`: the
    float32 CPU product form each row count takes, measured on this processor (models/cpu_forms.py)."""
    attention: str = "sdpa"
    gemv_as_reduction: bool = True
    cpu_forms: CpuForms = field(default_factory=CpuForms)

    def __post_init__(self):
        if self.attention not in ATTENTION_FORMS:
            raise ValueError(f"attention form {self.attention!r}: one of {ATTENTION_FORMS}")

    def traced(self) -> dict:
        """What decides the code a compiled step traces: a saved compile is named by it
        (engine/saved_compile.py), since its guards do not cover the plan."""
        return {"attention": self.attention, "gemv_as_reduction": self.gemv_as_reduction,
                "cpu_compiled_form": self.cpu_forms.compiled}


DEFAULT_PLAN = KernelPlan()   # frozen: every model and layer not yet given another shares it
