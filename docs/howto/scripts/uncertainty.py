"""Post-hoc calibrators, conformal prediction sets and logit OOD scores."""

import torch
from torch import nn

import snens
from snens.evaluation import conformal
from snens.evaluation.protocol import collect

torch.manual_seed(0)
centers = 0.8 * torch.randn(5, 16)  # five overlapping classes; OOD inputs lie far off
y = torch.randint(0, 5, (3000,))
x = centers[y] + 1.5 * torch.randn(3000, 16)
far = 6.0 + torch.randn(500, 16)


def batches(inputs, labels, size=250):
    return [
        (inputs[i : i + size], labels[i : i + size])
        for i in range(0, len(inputs), size)
    ]


train, val, test = (
    batches(x[:1500], y[:1500]),
    batches(x[1500:2250], y[1500:2250]),
    batches(x[2250:], y[2250:]),
)
ood = batches(far, torch.zeros(500, dtype=torch.long))

model = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 5))
ens = snens.convert(model, num_members=4)
optimizer = torch.optim.AdamW(snens.param_groups(ens, lr=3e-3))
for _ in range(20):  # epochs
    for inputs, labels in train:
        loss = snens.ensemble_loss(ens(inputs), labels) + snens.diversity_loss(ens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
ens.eval()

# 1. post-hoc calibration: fitted on validation, applied to test, one interface
val_logits, val_labels = collect(ens, val, logits=True)  # (M, N, K), (N,)
test_logits, test_labels = collect(ens, test, logits=True)
nll = snens.metrics.nll
print(
    f"test NLL {nll(snens.predictive_probs(test_logits), test_labels):.4f} uncalibrated"
)
for method in ("temperature", "vector", "matrix", "histogram"):
    calibrator = snens.fit_calibrator(method, val_logits, val_labels)
    probs = snens.predictive_probs(calibrator.apply(test_logits))
    print(f"test NLL {nll(probs, test_labels):.4f} after {method}")

# 2. prediction sets that contain the label with probability >= 1 − α
for score in ("thr", "aps", "raps"):
    predictor = conformal.calibrate(val_logits, val_labels, alpha=0.1, score=score)
    sets = predictor.predict(test_logits, generator=torch.Generator().manual_seed(0))
    print(
        f"{score}: coverage {conformal.coverage(sets, test_labels):.3f} "
        f"(target 0.900), mean size {conformal.mean_set_size(sets):.2f} classes"
    )

# ... and a check that they do: calibrate on a random half of the held-out examples,
# measure on the other half, 200 times (one fixed split covers a little over or under
# 1 − α by chance)
held_logits = torch.cat([val_logits, test_logits], dim=1)
check = conformal.resampled_coverage(
    held_logits, torch.cat([val_labels, test_labels]), alpha=0.1, score="thr"
)
print(
    f"thr over {check.splits} random splits: coverage {check.coverage:.3f} "
    f"± {check.coverage_std:.3f} from one split to the next"
)

# 3. OOD detection by each score, in one pass over the test and OOD sets
scores = ["msp", "entropy", "mutual_information", "max_logit", "energy"]
results = snens.evaluate(ens, test, ood={"far": ood}, ood_score=scores)
for score in scores:
    print(f"OOD AUROC by {score}: {results[f'ood/far/{score}/auroc']:.3f}")
