#!/usr/bin/env bash
# The GPU checks of the gpu target, in one call on the lent GPU machine:
#   PYTHONPATH=. bash tools/gpu_check.sh [OUT_DIR]
# Logs go to OUT_DIR (default ./gpu-logs); a short table is printed last.
set -u
final=${1:-${OUT:-gpu-logs}}
out=$(mktemp -d)  # logs gather here; $final gets one archive, the summary and the perf report
mkdir -p "$final"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
export FUSEGRAPH_CACHE_DIR=${FUSEGRAPH_CACHE_DIR:-/tmp/fusegraph-cache}
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  $py -c "import torch, triton, onnx, onnxruntime, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__, 'numpy', numpy.__version__)"; } 2>&1 | tee "$out/env.txt"
summary=()
deadline=$(( $(date +%s) + ${BUDGET_S:-100000} ))  # steps are cut to end by then
step() {  # step NAME timeout SECONDS COMMAND...: the timeout shrinks to fit the budget
  local name=$1; shift
  local t0=$(date +%s)
  local left=$(( deadline - t0 ))
  if [ "$left" -lt 15 ]; then summary+=("$(printf '%-20s skipped: out of time' "$name")"); return; fi
  if [ "$1" = timeout ] && [ "$2" -gt "$left" ]; then set -- timeout "$left" "${@:3}"; fi
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local dt=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  summary+=("$(printf '%-20s rc=%-3s %6ss  %s' "$name" "$rc" "$dt" "$(grep -E 'passed|failed|PASS|FAIL|Total time|rror' "$out/$name.log" | tail -1 | cut -c1-150)")")
}
steps=${STEPS:-"perf_fp16 perf_fp16_cached verify_fp16 verify_fp32 gpu_tests"}
for s in $steps; do
  case $s in
    gpu_tests) step gpu_tests timeout 300 $py -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu_kernels.py ;;
    verify_fp32) step verify_fp32 timeout 300 $py -m fusegraph.driver.cli verify yolov5s --target gpu ;;
    verify_fp16) step verify_fp16 timeout 60 $py -m fusegraph.driver.cli verify yolov5s --target gpu --fp16 ;;
    perf_fp16) step perf_fp16 timeout 70 $py -m fusegraph.driver.cli perf yolov5s --fp16 --configs --trace "$out/yolov5s_fp16_trace.json" ;;
    perf_fp16_cached) step perf_fp16_cached timeout 40 $py -m fusegraph.driver.cli perf yolov5s --fp16 ;;
    perf_fp16_exhaustive) step perf_fp16_exhaustive timeout 300 env FUSEGRAPH_CACHE_DIR=/tmp/fusegraph-cache-exhaustive FUSEGRAPH_TUNING_REPORT="$out/tuning_exhaustive.jsonl" $py -m fusegraph.driver.cli perf yolov5s --fp16 --exhaustive-tune ;;
    head_bench) step head_bench timeout 300 $py bench/head.py ;;
    head_configs) step head_configs timeout 240 $py bench/head_configs.py --levels 80 --iters 50 ;;
    head_ablate) step head_ablate timeout 120 $py bench/head_configs.py --ablate --iters 100 ;;
    yolov5s_b1) step yolov5s_b1 timeout 130 $py bench/yolov5s.py --batch 1 ;;
    yolov5s_b32) step yolov5s_b32 timeout 150 $py bench/yolov5s.py --batch 32 --quick ;;
    yolov5s_b32_full) step yolov5s_b32_full timeout 200 $py bench/yolov5s.py --batch 32 --only fusegraph,eager-graph,compile ;;
    yolov5s_b1_max_autotune) step yolov5s_b1_max_autotune timeout 420 $py bench/yolov5s.py --batch 1 --max-autotune --only fusegraph,compile-max-autotune ;;
    yolov5s_b32_max_autotune) step yolov5s_b32_max_autotune timeout 540 $py bench/yolov5s.py --batch 32 --max-autotune --only fusegraph,compile-max-autotune ;;
    node_subset) step node_subset timeout 120 $py -m pytest -q -p no:cacheprovider -rfE tests/conformance/test_conformance_gpu.py -k "${NODE_K:-double}" ;;
    node_tests) step node_tests timeout 200 $py -m pytest -q -p no:cacheprovider -n 15 -rfE -m "not slow" tests/conformance/test_conformance_gpu.py ;;
    kernel_tests_fast) step kernel_tests_fast timeout 150 $py -m pytest -q -p no:cacheprovider -n 8 -m "not slow" tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_zoo.py tests/gpu/test_gpu_cli.py ;;
    kernel_tests) step kernel_tests timeout 120 $py -m pytest -q -p no:cacheprovider -n 15 tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_zoo.py tests/gpu/test_gpu_cli.py ;;
    gpu_tests_all) step gpu_tests_all timeout 300 $py -m pytest -q -p no:cacheprovider -n 8 -m "not slow" tests/gpu tests/test_dynamic_batch.py ;;
    perf_dw) for m in ${PERF_MODELS:-convnext_tiny efficientnet_b1}; do
               step perf_$m timeout 120 $py -m fusegraph.driver.cli perf $m --fp16
               step floors_$m timeout 60 $py bench/kernel_floors.py "$out/perf_$m.log" --model $m; done ;;
    profiles) for mb in ${PROFILES:-convnext_tiny:1 bert_base:32}; do  # MODEL:BATCH, a per-kernel table against floors each
               m=${mb%%:*}; b=${mb##*:}
               step perf_${m}_b$b timeout 150 $py -m fusegraph.driver.cli perf $m --batch $b --fp16 --configs
               step floors_${m}_b$b timeout 60 $py bench/kernel_floors.py "$out/perf_${m}_b$b.log" --model $m --batch $b --fp16; done ;;
    cold_compile) for m in ${COLD_MODELS:-bert_base efficientnet_b1 yolov8s}; do  # empty caches: what a first compile costs
               step cold_$m timeout 150 env FUSEGRAPH_CACHE_DIR=/tmp/fgc-cold-$m-$$ TRITON_CACHE_DIR=/tmp/tc-cold-$m-$$ $py -m fusegraph.driver.cli perf $m --fp16; done ;;
    cold_ab) for m in ${COLD_MODELS:-efficientnet_b1 bert_base}; do  # a cold compile (both caches empty) of this tree against AB_BASE, alternating
               for side in base head; do
                 src=$([ $side = base ] && echo "${AB_BASE:?cold_ab: set AB_BASE to the baseline tree}" || echo "$PYTHONPATH")
                 step cold_${m}_$side timeout 150 env PYTHONPATH="$src" FUSEGRAPH_CACHE_DIR=/tmp/fgc-coldab-$m-$side-$$ TRITON_CACHE_DIR=/tmp/tc-coldab-$m-$side-$$ $py -m fusegraph.driver.cli perf $m --fp16
               done; done ;;
    defer_ab) step defer_ab timeout ${MODELS_S:-420} $py bench/models.py --batches 1,32 --models ${MODELS:-bert_base,vit_small_patch16_224} --modes fusegraph,fusegraph-defer,fusegraph-stats-apart,compile --name models-defer-ab --budget-s $(( ${MODELS_S:-420} - 20 )) ;;  # deferred layernorms (off by default) against the norms' own kernels
    models) step models timeout ${MODELS_S:-300} $py bench/models.py --batches ${MODEL_BATCHES:-1} --models ${MODELS:-resnet18} --modes ${MODEL_MODES:-fusegraph,eager,compile} --budget-s $(( ${MODELS_S:-300} - 20 )) --name ${MODEL_NAME:-models} ;;
    free_ab) step free_ab timeout ${MODELS_S:-200} $py bench/models.py --batches 1 --models ${MODELS:-convnext_tiny} --modes fusegraph,fusegraph-norms-kept,fusegraph-defer,compile --name models-free-ab --budget-s $(( ${MODELS_S:-200} - 20 ))  # the default (norms after depthwise convolutions deferred) against none deferred and against =1
             step perf_free timeout 120 $py -m fusegraph.driver.cli perf convnext_tiny --fp16 --configs
             step floors_free timeout 60 $py bench/kernel_floors.py "$out/perf_free.log" --model convnext_tiny --fp16 ;;
    norms_ab) step norms_ab timeout ${MODELS_S:-420} $py bench/models.py --batches 1,32 --models ${MODELS:-bert_base} --modes fusegraph,fusegraph-store-norms,fusegraph-defer,compile --name models-norms-ab --budget-s $(( ${MODELS_S:-420} - 20 )) ;;  # a post-norm's three ways: its own kernel (default), computed and stored by the product reading it, deferred past the product writing its rows
    defer_tests) step defer_tests timeout 120 $py -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_defer_norm.py ;;
    lane_ab) step lane_ab timeout ${MODELS_S:-200} $py bench/models.py --batches ${LANE_BATCHES:-1} --models ${MODELS:-convnext_tiny,vit_small_patch16_224} --modes fusegraph,fusegraph-chunk-stats,compile --name models-lane-ab --budget-s $(( ${MODELS_S:-200} - 20 ))  # deferred layernorm statistics summed lane by lane (the default) against per-chunk reductions
             step lane_head timeout 90 $py tools/tune_sweep.py --cases convnext_head --out "$out/sweep-lanes"  # ConvNeXt-T's 1-row classifier under every candidate
             for lanes in 0 1; do  # ViT-S/16's kernels each way (24 layernorm products at batch 1)
               step perf_vit_lanes$lanes timeout 90 env FUSEGRAPH_LANE_STATS=$lanes $py -m fusegraph.driver.cli perf vit_small_patch16_224 --fp16 --configs; done ;;
    tune_sweep) step tune_sweep timeout ${SWEEP_S:-400} $py tools/tune_sweep.py --cases ${SWEEP_CASES:-convnext_head,convnext_s1,convnext_s2,convnext_s3,convnext_s4} --case-seconds ${SWEEP_CASE_S:-120} --out "$out/sweep" ;;  # every candidate of the kernels in question, timed
    ab) for m in ${AB_MODELS:-bert_base vit_small_patch16_224}; do  # this tree against AB_BASE (another tree, e.g. `git archive REV`), perf per model, alternating
          for side in base head; do
            src=$([ $side = base ] && echo "${AB_BASE:?ab: set AB_BASE to the baseline tree}" || echo "$PYTHONPATH")
            step ab_${m}_$side timeout 120 env PYTHONPATH="$src" FUSEGRAPH_CACHE_DIR=/tmp/fgc-ab-$side $py -m fusegraph.driver.cli perf $m --fp16 --configs
          done; done ;;
    gemm_bench) step gemm_bench timeout 150 $py bench/gemm.py ;;
    gemm_gelu) step gemm_gelu timeout 90 $py bench/gemm.py --gelu --shapes b32 ;;
    gemm_tma) step gemm_tma timeout 150 env FUSEGRAPH_TMA=1 $py bench/gemm.py --shapes b32 --name gemm-tma ;;
    gemm_schedules) step gemm_schedules timeout 150 $py bench/gemm_schedules.py --only ${SCHEDULES:-ptr,tma_p,tmah,tmah_p} ;;
    attention_bench) step attention_bench timeout 150 $py bench/attention.py ;;
    saved_load) step saved_load timeout 120 $py bench/saved_load.py ;;
    dynamic_batch) step dynamic_batch timeout 180 $py bench/dynamic_batch.py ;;
    serve_bench) # the server travels as .work/tritonserver.tar.xz (tools/pack_tritonserver.sh; carry .work)
               if [ -f .work/tritonserver.tar.xz ]; then mkdir -p /tmp/tritonserver-site && tar xJf .work/tritonserver.tar.xz -C /tmp/tritonserver-site \
                 && touch /tmp/tritonserver-site/pytriton/__init__.py; fi
               step serve_compile timeout 300 $py -m fusegraph.driver.cli compile yolov5s --fp16 --batch ${SERVE_BATCH:-1..32} -o /tmp/serve-yolov5s.fgx
               step serve_bench timeout 240 env PYTHONPATH=$PYTHONPATH:/tmp/tritonserver-site $py bench/serve.py --model /tmp/serve-yolov5s.fgx --seconds 10 --name serve-yolov5s ;;
    *) echo "unknown step $s" ;;
  esac
done
cp bench/results/*.md "$out/" 2>/dev/null
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
tar czf "$final/gpu_logs.tgz" -C "$out" .
cp "$out/summary.txt" "$final/"
cp "$out/perf_fp16.log" "$final/" 2>/dev/null
cp "$out/perf_fp16_exhaustive.log" "$out/tuning_exhaustive.jsonl" "$final/" 2>/dev/null
# the results tables travel inside gpu_logs.tgz (few files may come back)
true
