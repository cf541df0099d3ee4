#!/usr/bin/env bash
# The engine's commands on the CPU-sized offline preset (seconds a run): train, resume,
# re-evaluate, a config file, runs trained apart pooled into one ensemble.
set -euo pipefail
snens train --list-presets
snens train --preset fashion_mnist_small_cnn_tiny --set method.temperature=0.5 \
    --set name=tau0.5 --out runs                        # the run directory: runs/tau0.5
snens train --resume runs/tau0.5                        # continue after a crash or kill
snens eval runs/tau0.5                                  # re-evaluate from last.pt
snens train --preset fashion_mnist_small_cnn_tiny --set method.name=single \
    --set method.num_members=1 --print-config > single.toml   # a config file to edit
snens train --config single.toml --set seed=0 --set name=single-s0 --out runs
snens train --config single.toml --set seed=1 --set name=single-s1 --out runs
# runs trained apart, measured as one ensemble from the logits they kept
snens pool runs/single-s0 runs/single-s1 --out runs/pooled
