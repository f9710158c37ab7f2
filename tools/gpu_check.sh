#!/usr/bin/env bash
# The GPU check: on a machine with NVIDIA GPUs, every cuda-marked test and the Trainer benchmark on CUDA, in one go,
# into one results file.
#
#   tools/gpu_check.sh [RESULTS_FILE]        (default: ./gpu_check_results.txt)
#
# What runs: ddp with NCCL, fsdp, model_parallel and DeepSpeed stages 2 and 3 on as many processes as there are GPUs
# (two at most), dp, exact resume under 16-mixed with its loss scaler, bf16-mixed and bf16-true, inductor on CUDA,
# manual optimization through the scaler, the CUDA allocator's peak memory (integration_tests/test_cuda_strategies.py,
# packages/core/tests/test_cuda_training.py), then tools/bench/run.py trainer --accelerator cuda (the Trainer's
# steps/s against a raw loop's). A cuda-marked test in another file joins by adding its file to TESTS below.
#
# Needs python3 (or $PYTHON) with a CUDA build of torch >= 2.9, pytest and pytest-timeout; nothing is downloaded.
# stratagem's packages come from this checkout (its sources first on the path); where they are not installed, their
# metadata (with the entry points that register the strategies) is written to a temporary directory on the path too. DeepSpeed's
# tests run where deepspeed is importable and are skipped, saying so, elsewhere. Bounded to under 8 minutes:
# 6 for the tests, 1.5 for the benchmark.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
results=$(realpath -m "${1:-gpu_check_results.txt}")
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
TESTS=(packages/core/tests/test_cuda_training.py integration_tests/test_cuda_strategies.py)

{
    echo "# stratagem GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
    "$python" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '| gpus', torch.cuda.device_count())"
} >"$results" 2>&1
if ! "$python" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "no CUDA GPU is usable by $python here: nothing to check" | tee -a "$results"
    exit 2
fi

packages=(core ddp fsdp)
if "$python" -c "import deepspeed" 2>/dev/null; then packages+=(deepspeed); fi
sources=""
for package in "${packages[@]}"; do sources="$sources:$root/packages/$package/src"; done
# This checkout's code first on the path, installed or not.
export PYTHONPATH="${sources#:}${PYTHONPATH:+:$PYTHONPATH}"
if ! "$python" -c "import importlib.metadata as m; [m.distribution(n) for n in ('stratagem', 'stratagem-ddp', 'stratagem-fsdp')]" 2>/dev/null; then
    "$python" - "$work/site" "$root" "${packages[@]}" <<'PY' || exit 1
import sys
from pathlib import Path

from stratagem.testing.plugins import write_distribution_of_project

site, root, *packages = sys.argv[1:]
for package in packages:
    write_distribution_of_project(Path(site), Path(root) / "packages" / package)
PY
    export PYTHONPATH="$work/site:$PYTHONPATH"
    echo "packages from this checkout, not installed: ${packages[*]}" >>"$results"
fi

export OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
cd "$root" || exit 1
echo "## pytest -m cuda ${TESTS[*]}" >>"$results"
timeout 360 "$python" -m pytest -m cuda -p no:cacheprovider -rA --timeout=300 "${TESTS[@]}" 2>&1 | tee -a "$results"
tests=${PIPESTATUS[0]}
echo "## tools/bench/run.py trainer --accelerator cuda --rounds 3 --no-lightning" >>"$results"
timeout 90 "$python" tools/bench/run.py trainer --accelerator cuda --rounds 3 --no-lightning 2>&1 | tee -a "$results"
bench=${PIPESTATUS[0]}
echo "## exit: tests $tests, benchmark $bench (124: out of time; the benchmark also exits 1 when a ratio misses its target)" | tee -a "$results"
[ "$tests" -eq 0 ]
