"""A norm of your own: one line tells snens which member norm computes it."""

import torch
from torch import nn

import snens


class MyLayerNorm(nn.LayerNorm):
    """A LayerNorm with a twist in its constructor; it computes LayerNorm."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, eps=1e-6)


snens.nn.register_norm(MyLayerNorm, snens.nn.MemberLayerNorm)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), MyLayerNorm(32), nn.ReLU(), nn.Linear(32, 3))
model.eval()
ens = snens.convert(model, num_members=4).eval()
x = torch.randn(5, 8)
with torch.no_grad():
    # every member is the model at conversion
    gap = (ens(x) - model(x)).abs().max().item()
print(ens.report)
print(f"largest difference of a member from the model: {gap:.1e}")
assert gap < 1e-5
