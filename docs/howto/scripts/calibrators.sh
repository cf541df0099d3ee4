#!/usr/bin/env bash
# A run with a validation split and every calibrator, then measured again at another α,
# with other calibrators and OOD scores, without retraining (the CPU-sized preset).
set -euo pipefail
snens train --preset fashion_mnist_small_cnn_tiny --set data.validation_examples=500 \
    --set 'data.calibrators=["temperature", "vector", "matrix", "histogram"]' \
    --set name=calibrated --out runs
snens eval runs/calibrated --alpha 0.05 --calibrators temperature histogram \
    --ood-scores energy mutual_information --no-corruptions
