"""Save a trained ensemble and load it again: its state dict into a fresh conversion."""

import tempfile
from pathlib import Path

import torch
from torch import nn

import snens


def build() -> nn.Module:
    return nn.Sequential(
        nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 3)
    )


torch.manual_seed(0)
ens = snens.convert(build(), num_members=4)
with torch.no_grad():
    for p in ens.parameters():  # stands in for training: the members now differ
        p.add_(0.1 * torch.randn_like(p))
path = Path(tempfile.mkdtemp()) / "ensemble.pt"
torch.save(ens.state_dict(), path)

# the same architecture and M, converted afresh
again = snens.convert(build(), num_members=4)
again.load_state_dict(torch.load(path, weights_only=True))
x = torch.randn(5, 8)
with torch.no_grad():
    assert torch.equal(again.eval()(x), ens.eval()(x))
print(f"reloaded {path.name}: the same (M, B, K) = {tuple(again(x).shape)} outputs")
