"""``snens demo``: single model vs σN-Ens at a few temperatures on the bundled Fashion-MNIST."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["DemoConfig", "FULL_DEMO", "run"]


@dataclass(frozen=True)
class DemoConfig:
    """Settings of ``snens demo``; ``--full`` uses the whole training set and more epochs."""

    train_examples: int = 10_000  # Fashion-MNIST training images used (of 60,000)
    test_examples: int = 10_000  # Fashion-MNIST test images (of 10,000)
    epochs: int = 3
    batch_size: int = 128  # examples per step, every member sees all of them
    lr: float = 3e-3  # AdamW base learning rate; gamma gets 30x
    width: int = 16  # SmallCNN first-stage channels
    num_members: int = 4
    temperatures: tuple[float, ...] = (0.05, 0.5, 5.0)
    diversity_weight: float = 0.1  # λ, on the sum over features
    seed: int = 0


FULL_DEMO = DemoConfig(train_examples=60_000, epochs=10, width=32)


def run(*, full: bool = False, out: str | os.PathLike = "runs/demo") -> int:
    """Train the demo's runs, print their table and write report.md and results.json to ``out``."""
    import torch

    import snens
    from snens.baselines import SingleModel
    from snens.data import (
        FASHION_MNIST_MEAN,
        FASHION_MNIST_STD,
        TensorLoader,
        load_fashion_mnist,
        load_mnist_5k,
    )
    from snens.models import create
    from snens.train import fit

    config = FULL_DEMO if full else DemoConfig()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    print(
        f"snens demo: Fashion-MNIST ({config.train_examples:,} train, "
        f"{config.test_examples:,} test), MNIST-5k as OOD, M={config.num_members}"
    )

    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    x_ood, y_ood = load_mnist_5k()
    norm = {"mean": FASHION_MNIST_MEAN, "std": FASHION_MNIST_STD}
    train = TensorLoader(
        x_train[: config.train_examples],
        y_train[: config.train_examples],
        config.batch_size,
        shuffle=True,
        drop_last=True,
        augment=("crop", "flip"),
        seed=config.seed,
        **norm,
    )
    test = TensorLoader(
        x_test[: config.test_examples], y_test[: config.test_examples], 1000, **norm
    )
    ood = TensorLoader(x_ood, y_ood, 1000, **norm)

    def model():
        return create("small_cnn", num_classes=10, in_channels=1, width=config.width)

    runs = [("single", None)] + [(f"σN-Ens τ={t:g}", t) for t in config.temperatures]
    rows = []
    for name, tau in runs:
        torch.manual_seed(config.seed)
        if tau is None:
            net = SingleModel(model())
        else:
            generator = torch.Generator().manual_seed(config.seed)
            net = snens.convert(model(), config.num_members, generator=generator)
        print(f"{name}: training {config.epochs} epochs")
        result = fit(
            net,
            train,
            epochs=config.epochs,
            lr=config.lr,
            temperature=tau or 1.0,
            diversity_weight=config.diversity_weight if tau else 0.0,
        )
        report = snens.evaluate(net, test, ood={"mnist": ood})  # OOD score: MSP
        row = {
            "method": name,
            "params": sum(p.numel() for p in net.parameters()),
            "accuracy": report["test/accuracy"],
            "nll": report["test/nll"],
            "ece": report["test/ece"],
            "brier": report["test/brier"],
            "ood_auroc": report["ood/mnist/auroc"],
            "disagreement": report["test/disagreement"],
            "effective_members": snens.mean_effective_members(net) if tau else 1.0,
            "k_star": snens.optimal_k(tau, config.num_members) if tau else 1.0,
            "train_seconds": result.seconds,
        }
        rows.append(row)

    table = _markdown(rows)
    print("\n" + table)
    (out_dir / "report.md").write_text(
        "# snens demo\n\n" + table + "\n\n" + _provenance(config) + "\n", encoding="utf-8"
    )
    (out_dir / "results.json").write_text(
        json.dumps({"config": asdict(config), "rows": rows}, indent=2), encoding="utf-8"
    )
    print(f"\nwrote {out_dir / 'report.md'} and {out_dir / 'results.json'}")
    return 0


def _markdown(rows: list[dict]) -> str:
    header = (
        "| method | params | acc | NLL | ECE | Brier | OOD AUROC (MSP) | disagreement "
        "| effective members | k*(τ) | train s |"
    )
    lines = [header, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['params']:,} | {r['accuracy']:.4f} | {r['nll']:.4f} "
            f"| {r['ece']:.4f} | {r['brier']:.4f} | {r['ood_auroc']:.4f} "
            f"| {r['disagreement']:.4f} | {r['effective_members']:.2f} | {r['k_star']:.2f} "
            f"| {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines)


def _provenance(config: DemoConfig) -> str:
    import torch

    return (
        f"seed {config.seed}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
