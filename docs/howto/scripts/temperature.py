"""Temperature scaling of an ensemble's prediction, fitted on a validation split."""

import torch
from torch import nn

import snens
from snens.evaluation.protocol import collect

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 3))
ens = snens.convert(model, num_members=4)
x, y = torch.randn(600, 8), torch.randint(0, 3, (600,))
val = [(x[i : i + 100], y[i : i + 100]) for i in range(0, 300, 100)]
test = [(x[i : i + 100], y[i : i + 100]) for i in range(300, 600, 100)]

logits, labels = collect(ens, val, logits=True)  # (M, N, K) member logits, (N,)
T = snens.fit_temperature(logits, labels)  # never fitted on the test set
scaled = snens.TemperatureScaled(ens, T)
before, after = snens.evaluate(ens, test), snens.evaluate(scaled, test)
print(f"T = {T:.3f}; test NLL {before['test/nll']:.3f} -> {after['test/nll']:.3f}")
