"""σN-Ens trained by Lightning (SnensModule), checkpointed and loaded again.

Needs `pip install '.[lightning]'`; a small CNN on 2,048 Fashion-MNIST images, a few
seconds an epoch on a CPU.
"""

import tempfile
from pathlib import Path

import lightning
import torch

import snens
from snens.data import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    TensorLoader,
    load_fashion_mnist,
)
from snens.integrations.lightning import SnensModule


def build_model():
    return snens.models.create("small_cnn", in_channels=1, num_classes=10, width=8)


images, labels = load_fashion_mnist("train")
normalize = {"mean": FASHION_MNIST_MEAN, "std": FASHION_MNIST_STD}
train_loader = TensorLoader(
    images[:2048], labels[:2048], 64, shuffle=True, seed=0, **normalize
)
val_loader = TensorLoader(images[-1024:], labels[-1024:], 256, **normalize)
directory = Path(tempfile.mkdtemp())
torch.manual_seed(0)
ens = snens.convert(build_model(), num_members=4)

# [fit]
module = SnensModule(ens, lr=3e-3, temperature=1.0, diversity_weight=0.1)
trainer = lightning.pytorch.Trainer(max_epochs=3, default_root_dir=directory)
trainer.fit(module, train_loader, val_loader)
# [fit end]
(scores,) = trainer.validate(module, val_loader, verbose=False)
print(
    f"val_loss (NLL of the members' mean) {scores['val_loss']:.3f}, "
    f"val_accuracy {scores['val_accuracy']:.3f}"
)
assert scores["val_accuracy"] > 0.5

path = directory / "ensemble.ckpt"
# [load]
trainer.save_checkpoint(path)  # or the checkpoints ModelCheckpoint writes
module = SnensModule.load_from_checkpoint(
    path, ensemble=snens.convert(build_model(), 4), weights_only=True
)
# [load end]
x, _ = next(iter(val_loader))
with torch.no_grad():
    assert torch.equal(module.ensemble.eval()(x), ens.eval()(x))
print("saved and loaded: the same (M, B, K) outputs", tuple(module.ensemble(x).shape))
