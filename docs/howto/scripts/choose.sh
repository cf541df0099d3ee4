#!/usr/bin/env bash
# Choose σN-Ens's recipe on the validation split (about a minute on a CPU): one model and three
# recipes, every run evaluated at its best validation epoch, two seeds each; the report keeps
# the row of lowest validation NLL (the test set plays no part) and compares every row with
# one model on test, with intervals.
set -euo pipefail
base=(--preset fashion_mnist_small_cnn_tiny --set optim.epochs=6 --set optim.select=nll
    --set data.validation_examples=1000 --no-progress)
# one model, and σN-Ens at the library's defaults (repeat inputs, τ=1, λ=0.1)
snens sweep "${base[@]}" --grid method.name=single,snens --grid seed=0,1 \
    --out runs/choose/defaults
# each member on its own share of every batch (split), at the defaults' τ and λ ...
snens sweep "${base[@]}" --set method.input_policy=split --grid seed=0,1 --out runs/choose/split
# ... and with a weaker partition of the features (τ=5, λ=0.01)
snens sweep "${base[@]}" --set method.input_policy=split --set method.temperature=5.0 \
    --set method.diversity_weight=0.01 --grid seed=0,1 --out runs/choose/split_weak
snens report runs/choose --out runs/choose/report \
    --baseline "runs/choose/defaults/method.name=single,seed=0"
