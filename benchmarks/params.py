"""Claim: σN-Ens costs ≈ 1× one model's parameters (ResNet-18 CIFAR, M=4: +0.6%), where a deep
ensemble costs M×.

Prints the parameter count of every backbone under every method at M=4, 10 classes, built on
PyTorch's meta device (no memory, no initialization), as the markdown table in the README.

    python benchmarks/params.py [--num-members 4] [--num-classes 10]
"""

import argparse

import torch

from snens.baselines import METHODS, create

BACKBONES = ("resnet18", "resnet50", "wrn28_10", "vit_small", "small_cnn", "mobilenet_v2")


def count(method: str, backbone: str, num_classes: int, num_members: int) -> int | None:
    if method == "packed" and backbone not in ("resnet18", "resnet50"):
        return None  # Packed-Ensembles needs its own grouped architecture
    options = {"backbone_options": {"in_channels": 3}} if backbone == "small_cnn" else {}
    with torch.device("meta"):
        model = create(
            method,
            backbone,
            num_classes=num_classes,
            num_members=1 if method == "single" else num_members,
            **options,
        )
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-members", type=int, default=4)
    parser.add_argument("--num-classes", type=int, default=10)
    args = parser.parse_args()
    print(f"| backbone | {' | '.join(METHODS)} |")
    print("|---|" + "---|" * len(METHODS))
    for backbone in BACKBONES:
        counts = {m: count(m, backbone, args.num_classes, args.num_members) for m in METHODS}
        single = counts["single"]
        cells = [
            "—" if n is None else f"{n / 1e6:.2f} M (×{n / single:.3f})" for n in counts.values()
        ]
        print(f"| {backbone} | {' | '.join(cells)} |")
    print(f"\nM={args.num_members}, {args.num_classes} classes; ×: relative to the single model")


if __name__ == "__main__":
    main()
