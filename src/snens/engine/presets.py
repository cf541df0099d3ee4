"""Named run configurations: the paper's settings and their offline, CPU-sized stand-ins.

    config = preset("cifar10_resnet18")          # a fresh RunConfig
    snens train --preset fashion_mnist_small_cnn --set optim.epochs=3

Each preset is an ordinary :class:`~snens.engine.config.RunConfig`, checked like any other; the list
with what each one is for is :data:`PRESETS` (and ``snens train --help``).
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
        name="",
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


# ResNet-18 CIFAR recipe (the field's common one): 75 epochs SGD lr 0.05, momentum 0.9, wd 5e-4,
# ×0.1 at epochs 25 and 50, batch 128, crop + flip.
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
# WRN-28-10 recipe (Zagoruyko & Komodakis 2016, as in uncertainty-baselines): 200 epochs SGD
# lr 0.1, Nesterov momentum 0.9, wd 5e-4, ×0.2 at epochs 60, 120, 160, one warm-up epoch.
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
    # Fine-tuning a pretrained RGB CNN, CPU-sized: MobileNetV2 with ImageNet weights on
    # Fashion-MNIST resized to 48 px, grey repeated to RGB, ImageNet-normalized; MNIST-5k as
    # OOD. All weights at lr 5e-4, gamma at 5e-4 × 3 = 0.0015, chosen on a validation split
    # (the converged study's vision_tune stage; its numbers are on the results page): faster,
    # gamma rescales the pretrained features before the shared weights adapt. Flips only: a
    # mirrored garment is the same class and the other Fashion-MNIST presets flip too; no
    # crop.
    "fashion_mnist_mobilenet_v2": RunConfig(
        data=DataConfig(
            dataset="fashion_mnist",
            train_examples=5000,
            validation_examples=0,
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
        optim=OptimConfig(
            optimizer="adamw",
            lr=5e-4,
            weight_decay=0.01,
            schedule="cosine",
            epochs=3,
            grad_clip=1.0,
            finetune="all",
        ),
    ),
    # ---- the paper's GPU settings
    "cifar10_resnet18": _cifar("cifar10", "resnet18", **_RESNET18),
    "cifar100_resnet18": _cifar("cifar100", "resnet18", **_RESNET18),
    "cifar10_wrn28_10": _cifar("cifar10", "wrn28_10", **_WRN28_10),
    "cifar100_wrn28_10": _cifar("cifar100", "wrn28_10", **_WRN28_10),
    # ViT-S/4 on CIFAR-10 from scratch: AdamW lr 1e-3, wd 0.05, cosine, 10 warm-up epochs.
    "cifar10_vit_small": RunConfig(
        data=DataConfig(
            dataset="cifar10",
            batch_size=128,
            ood=("svhn",),
            corruptions=True,
            corruption_examples=0,
        ),
        model=ModelConfig(backbone="vit_small"),
        method=MethodConfig(name="snens", num_members=4),
        optim=OptimConfig(
            optimizer="adamw",
            lr=1e-3,
            weight_decay=0.05,
            schedule="cosine",
            warmup_epochs=10,
            epochs=200,
            grad_clip=1.0,
            bf16=True,
        ),
    ),
    # ResNet-50 on ImageNet: SGD lr 0.1 at batch 256, wd 1e-4, ×0.1 at 30, 60, 80; 5 warm-up.
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
    # Offline stand-in for SST-2, CPU-sized: Rotten Tomatoes review snippets (a fixed 80/20
    # split), plot descriptions as OOD; pretrained MiniLM-L6, all weights fine-tuned at lr 1e-4,
    # gamma at 1e-4 × 50 = 0.005: in a short fine-tune a faster gamma (0.05) rescales the
    # pretrained features before the shared weights adapt (the results page); training the
    # norms and heads alone learned far less.
    "rotten_tomatoes_minilm": RunConfig(
        data=DataConfig(
            dataset="rotten_tomatoes",
            train_examples=2000,
            test_examples=1000,
            batch_size=32,
            eval_batch_size=250,
            augment=(),
            ood=("rt_plots",),
            ood_examples=500,
            max_length=64,
        ),
        model=ModelConfig(backbone="minilm", num_classes=2),
        method=MethodConfig(name="snens", num_members=4, gamma_lr_multiplier=50.0),
        optim=OptimConfig(
            optimizer="adamw",
            lr=1e-4,
            weight_decay=0.01,
            schedule="cosine",
            epochs=1,
            grad_clip=1.0,
            finetune="all",
        ),
    ),
    # Calibrated LLM fine-tuning: SmolLM2-135M-Instruct read at the end of a prompt, its
    # next-token scores of " negative" / " positive" as the class scores (member-specific
    # rows), LoRA r=8, α=16 on q_proj/v_proj (the base frozen), 1,000 Rotten Tomatoes
    # reviews of ≤ 64 tokens, 2 epochs. σN-Ens partitions the 61 RMSNorms weakly (τ=5,
    # λ=0.01; the library's defaults, τ=1 and λ=0.1, make the members weaker for twice the
    # disagreement there). Split inputs (member m trains on its quarter of each batch: one
    # fine-tune's compute and memory), chosen over repeat on the validation split of the LLM
    # study (its numbers are on the results page). At λ=0.01 the regularizer barely acts: the
    # members differ through their own quarters of each batch, their norms and their heads.
    "rotten_tomatoes_smollm2": RunConfig(
        data=DataConfig(
            dataset="rotten_tomatoes",
            train_examples=1000,
            test_examples=1000,
            batch_size=16,
            eval_batch_size=100,
            augment=(),
            ood=("rt_plots",),
            ood_examples=500,
            max_length=64,
        ),
        model=ModelConfig(backbone="smollm2", num_classes=2),
        method=MethodConfig(
            name="snens",
            num_members=4,
            temperature=5.0,
            diversity_weight=0.01,
            input_policy="split",
        ),
        optim=OptimConfig(
            optimizer="adamw",
            lr=3e-4,
            weight_decay=0.0,
            schedule="cosine",
            epochs=2,
            grad_clip=1.0,
            finetune="all",
        ),
    ),
    # SST-2 on pretrained MiniLM-L6: all weights fine-tuned, gamma at 1000× the base lr.
    "sst2_minilm": RunConfig(
        data=DataConfig(dataset="sst2", batch_size=32, augment=()),
        model=ModelConfig(backbone="minilm", num_classes=2),
        method=MethodConfig(name="snens", num_members=4, gamma_lr_multiplier=1000.0),
        optim=OptimConfig(
            optimizer="adamw",
            lr=2e-5,
            weight_decay=0.01,
            schedule="cosine",
            warmup_epochs=1,
            epochs=3,
            grad_clip=1.0,
            finetune="all",
        ),
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
