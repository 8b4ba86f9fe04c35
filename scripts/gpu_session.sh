#!/usr/bin/env bash
# One device call. Run from the repo root on the GPU machine:
#   bash scripts/gpu_session.sh tests [pytest args]   GPU-marked tests (default: tests/test_gpu.py tests/test_trust_gpu.py)
#   bash scripts/gpu_session.sh bench                 bench/timing_fidelity.py, its table into docs/benchmarks.md
#   bash scripts/gpu_session.sh corpus [kbeval args]  the seed corpus end to end (RUN_ID names the run)
#   bash scripts/gpu_session.sh throughput [args]     bench/throughput.py, its table into docs/benchmarks.md
# Results land in $OUT (a tarball of the run folder, the logs of each step).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD KBEVAL_CACHE_DIR=/tmp/kbeval-cache PYTHONUNBUFFERED=1 COLUMNS=220
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/gpu.txt"
case "${1:-tests}" in
  tests)
    targets=("${@:2}"); [ ${#targets[@]} -eq 0 ] && targets=(tests/test_gpu.py tests/test_trust_gpu.py)
    python3 -m pytest -q -m gpu -rA "${targets[@]}" > "$OUT/pytest_gpu.log" 2>&1; tail -60 "$OUT/pytest_gpu.log" ;;
  bench)
    python3 bench/timing_fidelity.py "${@:2}" 2>&1 | tee "$OUT/bench.log"
    cp docs/benchmarks.md "$OUT/" ;;
  throughput)
    python3 bench/throughput.py "${@:2}" 2>&1 | tee "$OUT/throughput.log"
    cp docs/benchmarks.md "$OUT/" ;;
  corpus)
    run_id=${RUN_ID:-seed-h100}
    start=$(date +%s)
    timeout "${KB_LIMIT:-86400}" python3 -m kernelbench_eval run --device cuda --out "$OUT/results" --run-id "$run_id" \
      --jobs 16 "${@:2}" \
      2>&1 | tee "$OUT/run.log"
    echo "wall seconds: $(( $(date +%s) - start ))" | tee -a "$OUT/run.log"
    tar czf "$OUT/results.tgz" -C "$OUT/results" "$run_id" && rm -rf "$OUT/results" ;;
esac
