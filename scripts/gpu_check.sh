#!/usr/bin/env bash
# What snens does on a machine with a CUDA device, measured in one run and written to one report.
#
#   scripts/gpu_check.sh [--device cuda|cpu] [--tiny] [--out FILE]
#
# Seven sections, each under its own time limit (seconds, LIMITS_* below), each written to the
# report even when it fails; the script goes on and exits 1 if any section failed:
#
#   1. environment    nvidia-smi, torch, CUDA, cuDNN, NCCL, triton, the device, bf16 support
#   2. CUDA tests     python -m pytest -q -m cuda over the test files that carry the marker,
#                     the Triton member-norm kernels' among them (on a CPU they are collected
#                     and skip); 4 xdist workers where pytest-xdist is installed, which compile
#                     the kernels' variants in parallel
#   3. bench ratios   snens bench --steps-only --bf16, --norms-only (tiny: --quick), and --llm: a
#                     random-init SmolLM2-135M (30 layers, bf16), σN-Ens-LoRA vs one LoRA model
#                     at M·B and vs a LoRA ensemble, member RMSNorm at LLM shapes; the norm and
#                     LLM rows again with SNENS_TRITON=0 (the member norms without the Triton
#                     kernels: the same card's before)
#   4. bench absolute snens bench --absolute: images/s and peak memory of single, σN-Ens and
#                     deep ensemble, CIFAR ResNet-18
#   5. torch.compile  benchmarks/compile_step.py: the compiled σN-Ens step against the compiled
#                     single model at M·B (fullgraph=True, inductor), a ViT of width 192
#   6. multi-GPU      2 processes over NCCL (torchrun), one epoch of the tiny preset
#   7. profile        benchmarks/profile_steps.py: torch.profiler tables of the σN-Ens step
#                     against its floor (SmolLM2-LoRA and ResNet-18 at M·B, bf16 on a GPU):
#                     time and kernel launches per step, top kernels, largest differences —
#                     where a ratio that misses its target loses its time
#
# The report ends with the rows of issue 51's table (member norms, the SmolLM2-LoRA step, the
# ResNet-18 / ViT-S steps at B=8, with and without the Triton kernels), gathered from the
# sections' output.
#
# On a GPU the limits add up to 475 s, so the check fits in 8 minutes of device time. Sections
# 3-5 and 7 run on --device: the models and inputs live on that device, the bf16 rows
# autocast there, and on CUDA each timed repeat starts and ends with torch.cuda.synchronize().
#
# --tiny (implied by --device cpu) shrinks every size, so that CI runs this same script on a CPU
# (tests/studies/test_gpu_check.py: 225 s of wall time on a 2-core machine at a load average of ~10,
# with section 3's runs without the Triton kernels and section 5's dynamo tracing). The report, by default results/gpu_<device>.md (results/gpu_nvidia-h200.md,
# results/gpu_cpu.md), names the device, the torch/CUDA versions, the git SHA, the date, and
# every command with its output.
#
# Environment: PYTHON (default .venv/bin/python when .venv exists, else python); HF_HUB_OFFLINE=1
# is exported. Exit status: 0 every section passed, 1 a section failed, 2 a usage error.
set -euo pipefail

CALLER_DIR=$PWD
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1

if [[ -d .venv ]]; then
    PY=${PYTHON:-.venv/bin/python}
else
    PY=${PYTHON:-python}
fi

#            env tests ratios absolute compile multi-GPU profile
LIMITS_GPU=(15 95 160 30 75 30 70)       # 475 s: the device-time budget
LIMITS_TINY=(60 180 360 180 180 60 180)  # a CPU run takes 2-6 min; these only stop a hang
MAX_LINES=400                            # of each command's output kept in the report (the tail)

usage() {
    cat <<'EOF'
usage: scripts/gpu_check.sh [--device cuda|cpu] [--tiny] [--out FILE]

  --device cuda|cpu  default: cuda when torch.cuda.is_available(), else cpu
  --tiny             shrink every size (implied by --device cpu)
  --out FILE         the report (default: results/gpu_<device name>.md)
EOF
}

die_usage() {
    printf 'gpu_check.sh: %s\n\n' "$1" >&2
    usage >&2
    exit 2
}

DEVICE=""
TINY=0
REPORT=""
while (($#)); do
    case $1 in
        --device)
            (($# >= 2)) || die_usage "--device needs a value: cuda or cpu"
            DEVICE=$2
            shift 2
            ;;
        --device=*) DEVICE=${1#*=}; shift ;;
        --tiny) TINY=1; shift ;;
        --out)
            (($# >= 2)) || die_usage "--out needs a file name"
            REPORT=$2
            shift 2
            ;;
        --out=*) REPORT=${1#*=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die_usage "unknown argument '$1'" ;;
    esac
done
case $DEVICE in
    "" | cuda | cpu) ;;
    *) die_usage "--device must be cuda or cpu, got '$DEVICE'" ;;
esac

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# One torch import for what the header and the defaults need: key<TAB>value lines.
PROBE='
import os, platform, torch
cuda = torch.cuda.is_available()
cpu = platform.processor() or platform.machine()
try:
    with open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
except (OSError, StopIteration):
    pass
info = {
    "cuda": cuda,
    "gpus": torch.cuda.device_count() if cuda else 0,
    "gpu_name": torch.cuda.get_device_name(0) if cuda else "",
    "torch": torch.__version__,
    "cuda_version": torch.version.cuda or "none (CPU build of torch)",
    "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else "none",
    "cpu": f"{cpu}, {os.cpu_count()} cores",
    "python": platform.python_version(),
}
try:
    import snens

    info["snens"] = os.path.dirname(snens.__file__)
except ImportError:
    info["snens"] = ""

for key, value in info.items():
    print(f"{key}\t{value}")
'
declare -A INFO
probe_out=$("$PY" -c "$PROBE") || {
    echo "gpu_check.sh: the probe of '$PY' failed (above); set PYTHON to a Python with torch" >&2
    exit 2
}
while IFS=$'\t' read -r key value; do
    INFO[$key]=$value
done <<<"$probe_out"
if [[ -z ${INFO[snens]} && -d src/snens ]]; then # a checkout whose package is not installed
    export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
    INFO[snens]="$PWD/src/snens (not installed in this Python: PYTHONPATH=src)"
fi

if [[ -z $DEVICE ]]; then
    if [[ ${INFO[cuda]} == True ]]; then DEVICE=cuda; else DEVICE=cpu; fi
fi
if [[ $DEVICE == cuda && ${INFO[cuda]} != True ]]; then
    die_usage "--device cuda, but torch ${INFO[torch]} sees no CUDA device \
(torch.cuda.is_available() is False); use --device cpu"
fi
if [[ $DEVICE == cpu ]]; then
    TINY=1
    DEVICE_NAME=cpu
    DEVICE_LINE="cpu (${INFO[cpu]})"
    LIMITS=("${LIMITS_TINY[@]}")
else
    DEVICE_NAME=${INFO[gpu_name]}
    DEVICE_LINE="${INFO[gpu_name]} (cuda:0, ${INFO[gpus]} CUDA device(s); host: ${INFO[cpu]})"
    LIMITS=("${LIMITS_GPU[@]}")
fi
if ((TINY)) && [[ $DEVICE == cuda ]]; then
    LIMITS=("${LIMITS_TINY[@]}")
fi

if [[ -z $REPORT ]]; then
    slug=$(printf '%s' "$DEVICE_NAME" | tr '[:upper:]' '[:lower:]' |
        sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g')
    REPORT=results/gpu_${slug:-unknown}.md
elif [[ $REPORT != /* ]]; then
    REPORT=$CALLER_DIR/$REPORT
fi
mkdir -p "$(dirname "$REPORT")"

# Sizes. Full: the bench defaults (M=4, B=8 for the ratios) and B=128 for --absolute.
if ((TINY)); then
    SIZES="tiny (M=2, B=2, 1 repeat for the ratios; B=4, 1 repeat for --absolute)"
    RATIO_SIZES=(--num-members 2 --batch 2 --repeats 1)
    ABS_MEMBERS=2 ABS_BATCH=4 ABS_REPEATS=1
else
    SIZES="full (ratios: M=4, B=8, 5 repeats, LLM 3; --absolute: M=4, B=128, 10 repeats, bf16)"
    RATIO_SIZES=(--repeats 5)
    ABS_MEMBERS=4 ABS_BATCH=128 ABS_REPEATS=10
fi

if SHA=$(git rev-parse HEAD 2>/dev/null); then
    if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
        SHA="$SHA (with uncommitted changes)"
    fi
else
    SHA="unknown (not a git checkout)"
fi

TINY_FLAG=""
if ((TINY)); then TINY_FLAG=" --tiny"; fi
{
    printf '# GPU check: %s\n\n' "$DEVICE_NAME"
    printf -- '- device: %s\n' "$DEVICE_LINE"
    printf -- '- torch %s, CUDA %s, cuDNN %s, Python %s\n' \
        "${INFO[torch]}" "${INFO[cuda_version]}" "${INFO[cudnn]}" "${INFO[python]}"
    printf -- '- git: %s\n' "$SHA"
    printf -- '- date: %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    printf -- '- command: scripts/gpu_check.sh --device %s%s --out %s\n' \
        "$DEVICE" "$TINY_FLAG" "$REPORT"
    printf -- '- python: %s; snens: %s\n' "$PY" "${INFO[snens]:-not importable}"
    printf -- '- environment: OMP_NUM_THREADS=%s, HF_HUB_OFFLINE=1\n' "${OMP_NUM_THREADS:-unset}"
    printf -- '- sizes: %s\n' "$SIZES"
} >"$REPORT"

# ------------------------------------------------------------------------------------------------
# Sections and commands
# ------------------------------------------------------------------------------------------------

SECTION_NAMES=() SECTION_RESULTS=() SECTION_SECONDS=() SECTION_LIMITS=()
FAILED=0
LAST_RC=0
LAST_LOG=""
LOG_COUNT=0

note() { printf '\n%s\n' "$*" >>"$REPORT"; }

section_begin() { # NUMBER TITLE
    SECTION_TITLE="$1. $2"
    SECTION_LIMIT=${LIMITS[$1 - 1]}
    SECTION_START=$SECONDS
    SECTION_FAILURES=()
    SECTION_UNCHECKED=""
    printf '\n## %s\n\ntime limit: %d s\n' "$SECTION_TITLE" "$SECTION_LIMIT" >>"$REPORT"
    printf '[%s] %s ...\n' "$(date '+%H:%M:%S')" "$SECTION_TITLE"
}

section_fail() { SECTION_FAILURES+=("$*"); }

# A section that had nothing to run here: its result says why instead of "passed".
section_unchecked() { SECTION_UNCHECKED=$*; }

section_end() {
    local seconds=$((SECONDS - SECTION_START)) result
    if ((${#SECTION_FAILURES[@]})); then
        result="FAILED: $(printf '%s; ' "${SECTION_FAILURES[@]}")"
        result=${result%; }
        FAILED=1
    else
        result=${SECTION_UNCHECKED:-passed}
    fi
    printf '\n**%s** in %d s (limit %d s)\n' "$result" "$seconds" "$SECTION_LIMIT" >>"$REPORT"
    printf '[%s] %s: %s in %d s\n' "$(date '+%H:%M:%S')" "$SECTION_TITLE" "$result" "$seconds"
    SECTION_NAMES+=("$SECTION_TITLE")
    SECTION_RESULTS+=("$result")
    SECTION_SECONDS+=("$seconds")
    SECTION_LIMITS+=("$SECTION_LIMIT")
}

# exec_logged SHOWN CMD...: run CMD within the section's remaining time and append SHOWN, the
# output's tail and the exit status to the report. Sets LAST_RC (124: out of time) and LAST_LOG.
exec_logged() {
    local shown=$1 left=$((SECTION_LIMIT - (SECONDS - SECTION_START))) start=$SECONDS
    shift
    LOG_COUNT=$((LOG_COUNT + 1))
    LAST_LOG=$WORK/command_$LOG_COUNT.log
    LAST_RC=0
    if ((left > 0)); then
        timeout --kill-after=10 "$left" "$@" >"$LAST_LOG" 2>&1 || LAST_RC=$?
    else
        printf 'not started: the section had used its %d s\n' "$SECTION_LIMIT" >"$LAST_LOG"
        LAST_RC=124
    fi
    local lines status
    lines=$(wc -l <"$LAST_LOG")
    status="exit $LAST_RC in $((SECONDS - start)) s"
    if ((LAST_RC == 124 || LAST_RC == 137)); then
        status="$status: stopped at the section's time limit"
    fi
    {
        printf '\n%s\n\n````text\n' "$shown"
        if ((lines > MAX_LINES)); then
            printf '[... the first %d of %d lines left out ...]\n' $((lines - MAX_LINES)) "$lines"
        fi
        tail -n "$MAX_LINES" "$LAST_LOG"
        printf '````\n\n%s\n' "$status"
    } >>"$REPORT"
}

# run CMD...: a command, shown as a shell line.
run() {
    local shown
    shown=$(printf '%q ' "$@")
    exec_logged "\`\$ ${shown% }\`" "$@"
}

# run_python CODE [ARG...]: a Python snippet, shown as a code block.
run_python() {
    local code=$1 args="" fence='```' shown
    shift
    if (($#)); then args=$(printf ' %q' "$@"); fi
    shown=$(printf '%spython\n# %s -c <this code>%s\n%s\n%s' \
        "$fence" "$PY" "$args" "$code" "$fence")
    exec_logged "$shown" "$PY" -c "$code" "$@"
}

# Fail the section if the last command did.
check() {
    case $LAST_RC in
        0) ;;
        124 | 137) section_fail "$1 stopped at the time limit (exit $LAST_RC)" ;;
        *) section_fail "$1 exited $LAST_RC" ;;
    esac
}

# ------------------------------------------------------------------------------------------------
# 1. environment
# ------------------------------------------------------------------------------------------------

section_begin 1 environment
if command -v nvidia-smi >/dev/null; then
    run nvidia-smi
    check nvidia-smi
else
    note "nvidia-smi: not found (no NVIDIA driver on this machine)"
fi
run_python '
import platform
import torch
import snens

print(f"python {platform.python_version()}, snens {snens.__version__}, {platform.platform()}")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}")
print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, "
      f"{torch.get_num_threads()} threads")
try:
    import triton

    print(f"triton {triton.__version__}")
except ImportError:
    print("triton: not installed (member norms take their vectorized paths on CUDA)")
if torch.cuda.is_available():
    try:
        v = torch.cuda.nccl.version()  # a tuple since torch 1.x, an int before
        print("NCCL", ".".join(map(str, v)) if isinstance(v, tuple) else v)
    except (AttributeError, RuntimeError) as error:
        print(f"NCCL: unavailable ({error})")
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        memory = p.total_memory / 2**30
        print(f"cuda:{i} {p.name}, {memory:.1f} GiB, compute capability {p.major}.{p.minor}")
    print(f"bf16 supported: {torch.cuda.is_bf16_supported()}")
else:
    print("CUDA devices: 0; bf16 supported: no CUDA device (CPU autocast only)")
'
check "the environment probe"
section_end

# ------------------------------------------------------------------------------------------------
# 2. CUDA tests
# ------------------------------------------------------------------------------------------------

section_begin 2 "CUDA tests"
# pytest runs with --strict-markers, under which "-m cuda" is an error until pyproject.toml
# registers the marker; until then run without it (a cuda-marked test only warns).
pytest_args=(-q -m cuda -p no:cacheprovider)
if grep -Eq '^[[:space:]]*"cuda[:"]' pyproject.toml; then
    registered=1
else
    registered=0
    pytest_args+=(-o addopts=-ra)
    note "The cuda marker is not registered in pyproject.toml:" \
        "pytest runs without --strict-markers."
fi
# Only the files that carry the marker: collecting the whole suite would import every optional
# dependency its other files need, which a GPU machine's environment need not have.
mapfile -t cuda_files < <(grep -rlE --include='test_*.py' 'mark\.cuda\b' tests | sort)
if ((${#cuda_files[@]} == 0)); then cuda_files=(tests); fi
if [[ $DEVICE == cuda ]] && "$PY" -c "import xdist" 2>/dev/null; then
    pytest_args+=(-n 4) # Triton compiles each kernel variant on first use: in parallel here
fi
run "$PY" -m pytest "${pytest_args[@]}" "${cuda_files[@]}"
summary=$(grep -E 'passed|failed|skipped|deselected|error|no tests ran' "$LAST_LOG" |
    tail -n 1 || true)
skipped=0
if [[ $summary =~ ([0-9]+)\ skipped ]]; then skipped=${BASH_REMATCH[1]}; fi
if ((LAST_RC == 5)); then # pytest: no test collected
    why="no test carries the cuda marker"
    ((registered)) || why="$why (and the marker is not registered yet)"
    if [[ ${INFO[cuda]} != True ]]; then
        note "**0 skipped (no CUDA device)**: $why."
    else
        note "**0 CUDA tests ran**: $why."
    fi
elif ((LAST_RC)); then
    check "pytest -m cuda"
    note "pytest: ${summary:-no summary line}"
else
    if [[ ${INFO[cuda]} != True ]]; then
        note "**$skipped skipped (no CUDA device)** — pytest: ${summary:-no summary line}"
    else
        note "pytest: ${summary:-no summary line}"
    fi
fi
section_end

# ------------------------------------------------------------------------------------------------
# 3. snens bench ratios
# ------------------------------------------------------------------------------------------------

section_begin 3 "snens bench ratios"
note "The ratios are measured on --device $DEVICE: $DEVICE_LINE."
if ((TINY)); then
    run "$PY" -m snens bench --quick --device "$DEVICE" "${RATIO_SIZES[@]}"
    check "snens bench --quick"
    LOG_STEPS=$LAST_LOG LOG_NORMS=$LAST_LOG
    run env SNENS_TRITON=0 "$PY" -m snens bench --norms-only --device "$DEVICE" \
        "${RATIO_SIZES[@]}"
    check "SNENS_TRITON=0 snens bench --norms-only"
    LOG_NORMS_OFF=$LAST_LOG
    llm=(--llm --llm-layers 1 --tokens 8 --device "$DEVICE" --num-members 2 --batch 2 --repeats 1)
else
    run "$PY" -m snens bench --steps-only --bf16 --device "$DEVICE" "${RATIO_SIZES[@]}"
    check "snens bench --steps-only --bf16"
    LOG_STEPS=$LAST_LOG
    run "$PY" -m snens bench --norms-only --device "$DEVICE" "${RATIO_SIZES[@]}"
    check "snens bench --norms-only"
    LOG_NORMS=$LAST_LOG
    run env SNENS_TRITON=0 "$PY" -m snens bench --norms-only --device "$DEVICE" \
        "${RATIO_SIZES[@]}"
    check "SNENS_TRITON=0 snens bench --norms-only"
    LOG_NORMS_OFF=$LAST_LOG
    # T=128: the step of a short-text fine-tune, launch-bound on a large GPU
    llm=(--llm --bf16 --device "$DEVICE" --batch 8 --tokens 128 --repeats 3)
fi
run "$PY" -m snens bench "${llm[@]}"
check "snens bench --llm"
LOG_LLM=$LAST_LOG
run env SNENS_TRITON=0 "$PY" -m snens bench "${llm[@]}"
check "SNENS_TRITON=0 snens bench --llm"
LOG_LLM_OFF=$LAST_LOG
section_end

# ------------------------------------------------------------------------------------------------
# 4. snens bench --absolute
# ------------------------------------------------------------------------------------------------

section_begin 4 "snens bench --absolute"
absolute=(--absolute --device "$DEVICE" --num-members "$ABS_MEMBERS" --batch "$ABS_BATCH"
    --repeats "$ABS_REPEATS")
bf16=()
if [[ $DEVICE == cuda ]]; then bf16=(--bf16); fi
run "$PY" -m snens bench "${absolute[@]}" "${bf16[@]}"
check "snens bench --absolute (ResNet-18)"
note "WRN-28-10: not run here (issue 51's check has ResNet-18 in its table; the H200's" \
    "report holds WRN-28-10's figures)."
section_end

# ------------------------------------------------------------------------------------------------
# 5. torch.compile
# ------------------------------------------------------------------------------------------------

section_begin 5 torch.compile
note "Like section 3, this runs on --device $DEVICE: the compiled σN-Ens step against the" \
    "compiled single model at M·B (benchmarks/compile_step.py, fullgraph=True, inductor)."
if ((TINY)); then
    # inductor takes minutes to compile a training step on one loaded CPU thread (measured,
    # 2-core machine): at tiny sizes dynamo traces the whole graph (fullgraph=True) and runs it
    # eagerly (--backend eager), so the run checks the tracing, the flags and the rows.
    note "--tiny: --backend eager (inductor needs minutes on one CPU thread), so the" \
        "compiled row times dynamo's graphs run eagerly."
    run "$PY" benchmarks/compile_step.py --models cnn --backend eager --device "$DEVICE" \
        --num-members 2 --batch 2 --repeats 1
else
    run "$PY" benchmarks/compile_step.py --models vit --device "$DEVICE" --repeats 5
fi
check "benchmarks/compile_step.py"
LOG_COMPILE=$LAST_LOG
section_end

# ------------------------------------------------------------------------------------------------
# 6. multi-GPU
# ------------------------------------------------------------------------------------------------

section_begin 6 "multi-GPU (NCCL)"
gpus=${INFO[gpus]}
if [[ $DEVICE == cuda ]] && ((gpus >= 2)); then
    # snens.engine.distributed picks NCCL whenever CUDA is available; NCCL_DEBUG=VERSION prints its
    # version once per rank, the evidence that NCCL carried the gradients.
    run env NCCL_DEBUG=VERSION "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
        -m snens.engine.cli train --preset fashion_mnist_small_cnn_tiny --set optim.epochs=1 \
        --set 'device="cuda"' --set 'name="nccl"' --no-progress --out "$WORK/ddp"
    check "torchrun --nproc_per_node=2 snens train"
    if ((LAST_RC == 0)); then
        if ! grep -q 'NCCL version' "$LAST_LOG"; then
            section_fail "no 'NCCL version' line: NCCL may not have been used"
        fi
        run_python 'import json, sys
print(json.dumps(json.load(open(sys.argv[1]))["metrics"], indent=1))' "$WORK/ddp/nccl/final.json"
        check "reading final.json"
    fi
elif [[ $DEVICE == cuda ]]; then
    section_unchecked "one GPU: NCCL not checked"
elif ((gpus == 0)); then
    section_unchecked "no GPU: NCCL not checked"
else
    section_unchecked "--device cpu ($gpus CUDA devices seen): NCCL not checked"
fi
section_end

# ------------------------------------------------------------------------------------------------
# 7. profile
# ------------------------------------------------------------------------------------------------

section_begin 7 profile
if ((TINY)); then
    run "$PY" benchmarks/profile_steps.py --device "$DEVICE" --llm-layers 1 --tokens 8 \
        --num-members 2 --batch 2 --steps 1 --top 5
else
    run "$PY" benchmarks/profile_steps.py --device "$DEVICE" --bf16
fi
check "benchmarks/profile_steps.py"
section_end

# ------------------------------------------------------------------------------------------------
# Summary
# ------------------------------------------------------------------------------------------------

# ------------------------------------------------------------------------------------------------
# Issue 51's rows, gathered from the sections' output
# ------------------------------------------------------------------------------------------------

# ratio LOG PATTERN: the ratio column of the first table row of LOG whose name matches PATTERN
# (an extended regular expression), or "—" where there is none (a section that failed or did
# not run).
ratio() {
    local found=""
    if [[ -n ${1:-} && -f $1 ]]; then
        found=$(grep -E "^\| [^|]*$2[^|]* \| [0-9.]+× \|" "$1" | head -n 1 |
            awk -F'|' '{gsub(/ /, "", $3); print $3}' || true)
    fi
    printf '%s' "${found:-—}"
}

{
    printf '\n## Issue 51: the rows of its table\n\n'
    printf 'From sections 3 and 5 (Triton: the default dispatch; without: SNENS_TRITON=0).\n\n'
    printf '| row | with the Triton kernels | without | target |\n|---|---|---|---|\n'
    for norm in BatchNorm2d LayerNorm GroupNorm RMSNorm; do
        pattern="member $norm fwd\+bwd bf16 autocast vs plain"
        printf '| member %s fwd+bwd vs plain, bf16 | %s | %s | ≤1.2× |\n' "$norm" \
            "$(ratio "${LOG_NORMS:-}" "$pattern")" "$(ratio "${LOG_NORMS_OFF:-}" "$pattern")"
    done
    pattern="member LlamaRMSNorm fwd\+bwd"
    printf '| member LlamaRMSNorm fwd+bwd, (M·B·T, 576) | %s | %s | ≤1.2× |\n' \
        "$(ratio "${LOG_LLM:-}" "$pattern")" "$(ratio "${LOG_LLM_OFF:-}" "$pattern")"
    pattern="σN-Ens-LoRA step \(B=[0-9]+\) vs one LoRA model at M·B"
    printf '| SmolLM2-LoRA σN-Ens step vs one LoRA model at M·B | %s | %s | ≤1.05× |\n' \
        "$(ratio "${LOG_LLM:-}" "$pattern")" "$(ratio "${LOG_LLM_OFF:-}" "$pattern")"
    for backbone in resnet18 vit_small; do
        printf '| %s σN-Ens step at B=8 vs one model at M·B | %s | not run | ≤1.1× |\n' \
            "$backbone" "$(ratio "${LOG_STEPS:-}" "$backbone: σN-Ens step \(B=[0-9]+\) vs single")"
    done
    printf '| compiled σN-Ens step vs compiled single at M·B (ViT) | %s | — | ≤1.05× |\n' \
        "$(ratio "${LOG_COMPILE:-}" "compiled σN-Ens step")"
} >>"$REPORT"

{
    printf '\n## Summary\n\n| section | result | seconds | limit (s) |\n|---|---|---|---|\n'
    for i in "${!SECTION_NAMES[@]}"; do
        printf '| %s | %s | %d | %d |\n' "${SECTION_NAMES[$i]}" "${SECTION_RESULTS[$i]}" \
            "${SECTION_SECONDS[$i]}" "${SECTION_LIMITS[$i]}"
    done
    printf '\nexit status: %d\n' "$FAILED"
} >>"$REPORT"
printf 'report: %s\n' "$REPORT"
exit "$FAILED"
