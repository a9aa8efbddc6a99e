#!/usr/bin/env bash
# The GPU checks of the gpu target, in one call on the lent GPU machine:
#   PYTHONPATH=. bash tools/gpu_check.sh [OUT_DIR]
# Logs go to OUT_DIR (default ./gpu-logs); a short table is printed last.
set -u
out=${1:-${OUT:-gpu-logs}}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
export FUSEGRAPH_CACHE_DIR=${FUSEGRAPH_CACHE_DIR:-/tmp/fusegraph-cache}
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  $py -c "import torch, triton, onnx, onnxruntime, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__, 'numpy', numpy.__version__)"; } 2>&1 | tee "$out/env.txt"
summary=()
step() {  # step NAME COMMAND...
  local name=$1; shift
  local t0=$(date +%s.%N)
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local dt=$(echo "$(date +%s.%N) - $t0" | bc)
  summary+=("$(printf '%-28s rc=%-3s %6.1fs  %s' "$name" "$rc" "$dt" "$(grep -E 'passed|failed|PASS|FAIL|Total time|error' "$out/$name.log" | tail -1)")")
}
steps=${STEPS:-"perf_fp16 perf_fp16_cached verify_fp16 verify_fp32 gpu_tests"}
for s in $steps; do
  case $s in
    gpu_tests) step gpu_tests timeout 300 $py -m pytest -q -x -p no:cacheprovider tests/test_gpu_kernels.py ;;
    verify_fp32) step verify_fp32 timeout 300 $py -m fusegraph.driver.cli verify yolov5s --target gpu ;;
    verify_fp16) step verify_fp16 timeout 300 $py -m fusegraph.driver.cli verify yolov5s --target gpu --fp16 ;;
    perf_fp16) step perf_fp16 timeout 300 $py -m fusegraph.driver.cli perf yolov5s --fp16 --trace "$out/yolov5s_fp16_trace.json" ;;
    perf_fp16_cached) step perf_fp16_cached timeout 120 $py -m fusegraph.driver.cli perf yolov5s --fp16 ;;
    *) step "$s" timeout 300 $py $s ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
