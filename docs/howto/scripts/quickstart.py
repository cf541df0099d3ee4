"""Convert a model, train it in your own loop, evaluate it: three lines change."""

import torch
from torch import nn

import snens

torch.manual_seed(0)
model = nn.Sequential(  # any model with norm layers
    nn.Conv2d(1, 16, 3, padding=1),
    nn.BatchNorm2d(16),
    nn.ReLU(),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(16, 10),
)
ens = snens.convert(model, num_members=4)  # 1: the ensemble
print(ens.report)
optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=3e-3))  # 2: γ's own group
x, y = torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))
for _ in range(20):
    logits = ens(x[:64])  # (M, B, K) = (4, 64, 10)
    loss = snens.ensemble_loss(logits, y[:64]) + snens.diversity_loss(ens)  # 3: loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.3f} (the task loss minus λ × the gain over equal sharing)")
loader = [(x[i : i + 64], y[i : i + 64]) for i in range(0, 256, 64)]
report = snens.evaluate(ens, loader)
print({k: round(v, 3) for k, v in report.items() if k in ("test/accuracy", "test/nll")})
print(f"effective members per feature: {snens.mean_effective_members(ens):.2f} of 4")
