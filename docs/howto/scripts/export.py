"""Export the whole ensemble with torch.export: one program, any batch size."""

import torch
from torch import nn

import snens

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 3))
ens = snens.convert(model, num_members=4).eval()
program = snens.export(ens, torch.randn(5, 8))  # an example with B >= 2
for batch in (1, 7):
    x = torch.randn(batch, 8)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), ens(x), rtol=1e-5, atol=1e-5)
print("exported; (M, B, K) at B = 1 and 7:", tuple(program.module()(torch.randn(7, 8)).shape))
