"""Named run configurations: the paper's settings and their offline, CPU-sized stand-ins.

config = preset("cifar10_resnet18")          # a fresh RunConfig, checked like any other
snens train --preset fashion_mnist_small_cnn --set optim.epochs=3
"""

from __future__ import annotations

from typing import Any

from snens.engine.config import (
    DataConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    did_you_mean,
    from_dict,
    to_dict,
)

__all__ = ["PRESETS", "preset"]


def _cifar(dataset: str, backbone: str, **optim: Any) -> RunConfig:
    """The paper's CIFAR setting: σN-Ens, M=4, SVHN as OOD, all corruptions at 1..5."""
    return RunConfig(
        data=DataConfig(
            dataset=dataset,
            batch_size=128,
            augment=("crop", "flip"),
            ood=("svhn",),
            corruptions=True,
            corruption_examples=0,
        ),
        model=ModelConfig(backbone=backbone),
        method=MethodConfig(name="snens", num_members=4),
        optim=OptimConfig(**optim),
    )


# the field's common ResNet-18 CIFAR recipe
_RESNET18 = {
    "optimizer": "sgd",
    "lr": 0.05,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "schedule": "multistep",
    "milestones": (25, 50),
    "lr_decay": 0.1,
    "epochs": 75,
}
# WRN-28-10 recipe (Zagoruyko & Komodakis 2016, as in uncertainty-baselines)
_WRN28_10 = {
    "optimizer": "sgd",
    "lr": 0.1,
    "momentum": 0.9,
    "nesterov": True,
    "weight_decay": 5e-4,
    "schedule": "multistep",
    "milestones": (60, 120, 160),
    "lr_decay": 0.2,
    "warmup_epochs": 1,
    "epochs": 200,
}

#: AdamW on a cosine schedule, gradients clipped at norm 1
_ADAMW = {"optimizer": "adamw", "schedule": "cosine", "grad_clip": 1.0}
#: Rotten Tomatoes as the text presets read it: plot texts as OOD, 64 tokens
_ROTTEN_TOMATOES = {"dataset": "rotten_tomatoes", "test_examples": 1000, "augment": ()}
_ROTTEN_TOMATOES |= {"ood": ("rt_plots",), "ood_examples": 500, "max_length": 64}

PRESETS: dict[str, RunConfig] = {
    # ---- offline stand-ins, CPU-sized: Fashion-MNIST for CIFAR-10, MNIST-5k for SVHN
    "fashion_mnist_small_cnn": RunConfig(
        data=DataConfig(
            dataset="fashion_mnist",
            train_examples=10_000,
            batch_size=128,
            augment=("crop", "flip"),
            ood=("mnist_5k",),
            corruptions=True,
            corruption_names=("gaussian_noise", "defocus_blur", "contrast", "pixelate"),
            corruption_examples=1000,
        ),
        model=ModelConfig(backbone="small_cnn", options={"width": 16}),
        method=MethodConfig(name="snens", num_members=4),
        optim=OptimConfig(optimizer="adamw", lr=3e-3, schedule="cosine", epochs=3),
    ),
    # a smoke test in seconds: 1,000 images, width 4, one epoch
    "fashion_mnist_small_cnn_tiny": RunConfig(
        data=DataConfig(
            dataset="fashion_mnist",
            train_examples=1000,
            test_examples=1000,
            batch_size=100,
            augment=(),
            ood=("mnist_5k",),
            ood_examples=1000,
        ),
        model=ModelConfig(backbone="small_cnn", options={"width": 4}),
        method=MethodConfig(name="snens", num_members=4),
        optim=OptimConfig(optimizer="adamw", lr=1e-2, schedule="cosine", epochs=1),
    ),
    # the CIFAR recipe's network and optimizer on Fashion-MNIST (1 channel), fewer epochs
    "fashion_mnist_resnet18": RunConfig(
        data=DataConfig(
            dataset="fashion_mnist",
            batch_size=128,
            ood=("mnist_5k",),
            corruptions=True,
            corruption_examples=1000,
        ),
        model=ModelConfig(backbone="resnet18"),
        method=MethodConfig(name="snens", num_members=4),
        optim=OptimConfig(**{**_RESNET18, "epochs": 15, "milestones": (5, 10)}),
    ),
    # fine-tuning a pretrained RGB CNN, CPU-sized: Fashion-MNIST at 48 px as RGB; gamma's lr
    # (×3) chosen on a validation split: faster, it rescales the pretrained features first
    "fashion_mnist_mobilenet_v2": RunConfig(
        data=DataConfig(
            dataset="fashion_mnist",
            train_examples=5000,
            test_examples=1000,
            batch_size=32,
            eval_batch_size=250,
            augment=("flip",),
            ood=("mnist_5k",),
            ood_examples=1000,
            resize=48,
            channels=3,
            normalize="imagenet",
        ),
        model=ModelConfig(backbone="mobilenet_v2", num_classes=10, options={"pretrained": True}),
        method=MethodConfig(name="snens", num_members=4, gamma_lr_multiplier=3.0),
        optim=OptimConfig(**_ADAMW, lr=5e-4, weight_decay=0.01, epochs=3),
    ),
    # ---- the paper's GPU settings
    "cifar10_resnet18": _cifar("cifar10", "resnet18", **_RESNET18),
    "cifar100_resnet18": _cifar("cifar100", "resnet18", **_RESNET18),
    "cifar10_wrn28_10": _cifar("cifar10", "wrn28_10", **_WRN28_10),
    "cifar100_wrn28_10": _cifar("cifar100", "wrn28_10", **_WRN28_10),
    # ViT-S/4 on CIFAR-10 from scratch
    "cifar10_vit_small": _cifar(
        "cifar10",
        "vit_small",
        **_ADAMW,
        lr=1e-3,
        weight_decay=0.05,
        warmup_epochs=10,
        epochs=200,
        bf16=True,
    ),
    "imagenet_resnet50": RunConfig(
        data=DataConfig(dataset="imagenet", batch_size=256, eval_batch_size=500),
        model=ModelConfig(backbone="resnet50", num_classes=1000),
        method=MethodConfig(name="snens", num_members=4),
        optim=OptimConfig(
            optimizer="sgd",
            lr=0.1,
            momentum=0.9,
            weight_decay=1e-4,
            schedule="multistep",
            milestones=(30, 60, 80),
            warmup_epochs=5,
            epochs=90,
            bf16=True,
            channels_last=True,
        ),
    ),
    # offline stand-in for SST-2, CPU-sized; in a short fine-tune a faster gamma (×50)
    # rescales the pretrained features before the shared weights adapt
    "rotten_tomatoes_minilm": RunConfig(
        data=DataConfig(
            **_ROTTEN_TOMATOES, train_examples=2000, batch_size=32, eval_batch_size=250
        ),
        model=ModelConfig(backbone="minilm", num_classes=2),
        method=MethodConfig(name="snens", num_members=4, gamma_lr_multiplier=50.0),
        optim=OptimConfig(**_ADAMW, lr=1e-4, weight_decay=0.01, epochs=1),
    ),
    # calibrated LLM fine-tuning: SmolLM2-135M-Instruct's next-token scores of " negative" /
    # " positive" as the class scores; a weak partition (τ=5, λ=0.01) and split inputs (one
    # fine-tune's compute), chosen on the validation split of the LLM study
    "rotten_tomatoes_smollm2": RunConfig(
        data=DataConfig(
            **_ROTTEN_TOMATOES, train_examples=1000, batch_size=16, eval_batch_size=100
        ),
        model=ModelConfig(backbone="smollm2", num_classes=2),
        method=MethodConfig(
            name="snens",
            num_members=4,
            temperature=5.0,
            diversity_weight=0.01,
            input_policy="split",
        ),
        optim=OptimConfig(**_ADAMW, lr=3e-4, epochs=2),
    ),
    "sst2_minilm": RunConfig(
        data=DataConfig(dataset="sst2", batch_size=32, augment=()),
        model=ModelConfig(backbone="minilm", num_classes=2),
        method=MethodConfig(name="snens", num_members=4, gamma_lr_multiplier=1000.0),
        optim=OptimConfig(**_ADAMW, lr=2e-5, weight_decay=0.01, warmup_epochs=1, epochs=3),
    ),
}


def preset(name: str) -> RunConfig:
    """The named preset (a fresh copy); see :data:`PRESETS`.

    Raises:
        ValueError: an unknown name; the message lists the presets.
    """
    if name not in PRESETS:
        raise ValueError(
            f"unknown preset {name!r}{did_you_mean(name, PRESETS)}; presets: {', '.join(PRESETS)}"
        )
    return from_dict(to_dict(PRESETS[name]))
