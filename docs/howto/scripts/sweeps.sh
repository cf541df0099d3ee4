#!/usr/bin/env bash
# A sweep and its report on the CPU-sized offline preset (about a minute on a CPU).
set -euo pipefail
# τ × seeds; every run goes to runs/sweeps/tau/<grid values>
snens sweep --preset fashion_mnist_small_cnn_tiny \
    --grid method.temperature=0.05,5 --grid seed=0,1 --out runs/sweeps/tau
# methods against each other: τ and λ apply to snens only, "single" runs once per seed
# with M=1; --dry-run checks the grid and lists the runs, and trains nothing
snens sweep --preset fashion_mnist_small_cnn \
    --grid method.name=single,deep_ensemble,snens --grid method.temperature=0.05,5 \
    --grid seed=0,1,2 --out runs/sweeps/methods --dry-run
# mean ± std over seeds per configuration: report.md, report.csv, Pareto plots
snens report runs/sweeps/tau --out runs/sweeps/tau/report
