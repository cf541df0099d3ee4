"""The ``snens`` command line."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["main"]


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


def _demo(args: argparse.Namespace) -> int:
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

    config = FULL_DEMO if args.full else DemoConfig()
    out_dir = Path(args.out)
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


def _bench(args: argparse.Namespace) -> int:
    from snens import benchmark

    return benchmark.main(args.rest)


def _train(args: argparse.Namespace) -> int:
    from snens.checkpoint import CheckpointError
    from snens.config import PRESETS, load_config, preset, to_toml
    from snens.runs import CONFIG, RunDirError
    from snens.train import NonFiniteLossError, train

    if args.list_presets:
        for name, config in PRESETS.items():
            print(
                f"{name:32s} {config.data.dataset}, {config.model.backbone}, "
                f"{config.method.name} M={config.method.num_members}, "
                f"{config.optim.optimizer} {config.optim.epochs} epochs"
            )
        return 0
    sources = [x for x in (args.preset, args.config, args.resume) if x is not None]
    if len(sources) != 1:
        print(
            "snens train: give one of --preset NAME, --config FILE, --resume RUN_DIR "
            "(snens train --list-presets shows the presets)",
            file=sys.stderr,
        )
        return 2
    if args.resume is not None and args.out is not None:
        print(
            "snens train: --out does not apply to --resume (the run stays where it is)",
            file=sys.stderr,
        )
        return 2
    overrides = list(args.set)
    if args.out is not None:
        overrides.append(f"out_dir={json.dumps(args.out)}")
    try:
        if args.preset is not None:
            config = load_config(preset(args.preset), overrides)
        elif args.config is not None:
            config = load_config(args.config, overrides)
        else:
            config = load_config(Path(args.resume) / CONFIG, list(args.set))
    except (ValueError, TypeError, OSError) as error:
        print(f"snens train: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        print(to_toml(config), end="")
        return 0
    try:
        run_dir = train(
            config,
            resume=args.resume is not None,
            progress=not args.no_progress,
            run_dir=args.resume,
        )
    except NonFiniteLossError as error:
        print(f"snens train: {error}", file=sys.stderr)
        return 1
    except (RunDirError, CheckpointError, FileNotFoundError, ValueError) as error:
        print(f"snens train: {error}", file=sys.stderr)
        return 2
    print(run_dir)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from snens.checkpoint import CheckpointError
    from snens.runs import RunDirError, to_json
    from snens.train import evaluate_run

    try:
        results, state = evaluate_run(args.run_dir)
    except (RunDirError, CheckpointError, FileNotFoundError) as error:
        print(f"snens eval: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(to_json(results, indent=2))
    else:
        print(f"{args.run_dir}: last.pt after epoch {state['epoch']} (step {state['step']})\n")
        print(_metrics_table(results))
    return 0


def _metrics_table(results: dict[str, float]) -> str:
    lines = ["| metric | value |", "|---|---|"]
    lines += [f"| {key} | {value:.4f} |" for key, value in results.items()]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snens",
        description="σN-Ens: sigma-Norm implicit ensembles with temperature-controlled diversity.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train",
        help="train one run from a preset or a TOML config (resumable), evaluate it, and keep "
        "config, versions, git SHA, per-epoch metrics and checkpoints in its run directory",
        description="Train one run and evaluate it. The run directory (out_dir/name) receives "
        "config.toml, provenance.json, metrics.jsonl, last.pt/prev.pt and final.json.",
    )
    train.add_argument("--preset", metavar="NAME", help="a named preset (see --list-presets)")
    train.add_argument("--config", metavar="FILE", help="a TOML config file")
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="continue an interrupted run from its last.pt"
    )
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set method.temperature=0.5 --set optim.epochs=3 "
        '(values are TOML: 0.5, true, [25, 50], "text")',
    )
    train.add_argument("--out", metavar="DIR", help="parent directory of the run (out_dir)")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    train.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    train.set_defaults(run=_train)
    evaluate = sub.add_parser(
        "eval",
        help="re-evaluate a run from its last.pt (loaded with weights_only) and print the "
        "metrics table",
        description="Rebuild a run's model and data from its config.toml, load last.pt "
        "(verified, weights_only) and run the full evaluation.",
    )
    evaluate.add_argument("run_dir", metavar="RUN_DIR", help="a directory made by snens train")
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    evaluate.set_defaults(run=_eval)
    demo = sub.add_parser(
        "demo",
        help="train a single model and σN-Ens at three temperatures on Fashion-MNIST, "
        "report accuracy, NLL, ECE, Brier, OOD AUROC and the realized sharing",
    )
    demo.add_argument("--full", action="store_true", help="all 60k training images, 10 epochs")
    demo.add_argument("--out", default="runs/demo", help="directory for report.md, results.json")
    demo.set_defaults(run=_demo)
    bench = sub.add_parser(
        "bench",
        add_help=False,
        help="measure σN-Ens's cost against one model at M·B and a deep ensemble (ratios)",
    )
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args, rest = build_parser().parse_known_args(argv)
    if rest and args.command != "bench":
        build_parser().parse_args(argv)  # reports the unknown arguments and exits
    args.rest = rest
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
