"""The ``snens`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from snens import demo

    return demo.run(full=args.full, out=args.out)


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
