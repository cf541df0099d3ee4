#!/usr/bin/env bash
# Choose σN-Ens's recipe on a probe (about half a minute on a CPU): four recipes each trained
# for the first 2 of 8 epochs of the schedule (a quarter; without --probe-epochs, half), the
# one of lowest validation NLL so far trained to the end; its run directory is the result.
set -euo pipefail
snens tune --preset fashion_mnist_small_cnn_tiny --set optim.epochs=8 \
    --set data.validation_examples=1000 --probe-epochs 2 --no-progress --out runs/tune
cat runs/tune/tune.json
