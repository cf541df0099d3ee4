"""Export the whole ensemble: a torch.export program and an ONNX file, any batch size.

The ONNX part needs `pip install '.[export]'` (onnx, onnxscript, onnxruntime).
"""

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from torch import nn

import snens

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 3))
x, x_new = torch.randn(5, 8), torch.randn(7, 8)

ens = snens.convert(model, num_members=4).eval()
program = snens.export(ens, x)  # x: an example batch with B >= 2
logits = program.module()(x_new)  # (M, B', K) for any B' >= 1
path = Path(tempfile.mkdtemp()) / "ensemble.onnx"
snens.export_onnx(ens, path, x)  # input "input", output "logits" (M, batch, K)

session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
(onnx_logits,) = session.run(["logits"], {"input": x_new.numpy()})
with torch.no_grad():
    expected = ens(x_new)
torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(onnx_logits, expected.numpy(), rtol=1e-5, atol=1e-5)
print(
    "exported; (M, B, K) at B = 7:",
    tuple(logits.shape),
    "in torch.export and ONNX Runtime",
)
