"""Claim: σN-Ens (M=4) trains at ≤ 1.05× one plain model on a batch of M·B, ≤ 1.0× a deep
ensemble on CPU, with ≤ 1.01× its parameters; member norms cost ≤ 1.2× a plain norm.

Runs every variant interleaved in one process and prints median ratios with their spread,
the machine and versions. See README "Performance" for the recorded table.

    python benchmarks/bench.py [--quick] [--repeats 7] [--threads 2]
"""

import sys

from snens.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
