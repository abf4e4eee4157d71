"""A trial, not engine code: benchmarks.step_costs with every float32 Linear on CPU computed by MKL's
packed GEMM (torch.ops.mkl._mkl_linear over a weight packed once by _mkl_reorder_linear_weight).
In isolation (a weight hot in cache) the packed form costs about the same for 1-8 rows, where
F.linear steps up at 4; in the whole model it made a 2-4 token verify 1.4x a decode step
(smollm2_packed.md) against F.linear's 1.06-1.12x at 2-3 tokens, so the engine keeps F.linear.

  PYTHONPATH=. .venv/bin/python benchmarks/results/cpu_real_pair/costs_s17/packed_linear_trial.py \
      --model GGUF --draft shipped/smollm2/drafter --max-verify 5 --cycle-steps 2,3 --ref-steps 2 --iters 20 \
      --device cpu --dtype float32 --name smollm2_packed --out-dir benchmarks/results/cpu_real_pair/costs_s17
"""
import sys

import torch

import models.layers as layers
from benchmarks.step_costs import main

dense_forward = layers.Linear.forward


def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return dense_forward(self, x)
    packed = self.__dict__.get("_packed")
    if packed is None:
        packed = self.__dict__["_packed"] = torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), 1)
    rows = x.reshape(-1, self.in_features)
    y = torch.ops.mkl._mkl_linear(rows, packed, self.weight, self.bias, rows.shape[0])
    return y.reshape(*x.shape[:-1], self.out_features)


if __name__ == "__main__":
    layers.Linear.forward = packed_forward
    main(sys.argv[1:])
