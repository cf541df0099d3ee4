"""Claim: σN-Ens (M=4) trains at ≤ 1.05× one plain model on a batch of M·B, ≤ 1.0× a deep
ensemble on CPU, with ≤ 1.01× its parameters; member norms cost ≤ 1.2× a plain norm (forward +
backward in float32 and under bf16 autocast, and eval forward). Also reported: channels-last
vs contiguous, inference images/s and peak memory against a deep ensemble, and with
``--compile`` the torch.compile step against eager (opt-in: compiling ResNet-18's training
step takes minutes on one CPU thread).

Runs every variant interleaved in one process and prints median ratios with their spread,
the machine and versions. See results/bench_cpu.md and README "Performance" for the record.

    python benchmarks/bench.py [--quick] [--compile | --compile-only] [--device cuda]
        [--repeats 7] [--threads 1]
"""

import sys

from harness import main

if __name__ == "__main__":
    sys.exit(main())
