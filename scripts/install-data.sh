#!/usr/bin/env bash
# Installs the offline stand-in for CIFAR-10: Fashion-MNIST from Debian's dataset-fashion-mnist.
set -euo pipefail
dir=/usr/share/datasets/fashion-mnist
if [ -f "$dir/t10k-labels-idx1-ubyte.gz" ]; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
elif [ -z "${SNENS_DATA:-}" ]; then
  echo "Fashion-MNIST not found in $dir: run 'sudo apt-get install dataset-fashion-mnist'," >&2
  echo "or put the four IDX .gz files in \$SNENS_DATA/fashion-mnist/." >&2
  exit 1
fi
