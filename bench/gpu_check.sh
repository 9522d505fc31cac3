#!/usr/bin/env bash
# Everything a GPU must show, in one call on the device machine (what holds now: docs/validation.md):
#   STEP=known  the known kernels (bench/gpu_known.py), at a call's start and end: they must agree
#   STEP=tests  the CUDA red team (tests/test_gpu.py) and honest references on every task (tests/test_honest.py)
#   STEP=runA / runB  `kgen run -c examples/config-h100-ab.yaml` into db/h100-A.db or -B.db (fresh baselines each)
#   STEP=compare  runA against runB, attempt by attempt (bench/gpu_compare.py)
#   STEP=refine  `kgen run -c examples/config-refine.yaml` at KernelBench sizes on cuda, then per turn (search_turns.py)
#   STEP=run    `kgen run -c examples/config-h100.yaml` (KernelBench sizes, cuda backend; resumes if cut off)
#   STEP=bench  timing fidelity: one kernel evaluated twice; baselines and cost per attempt
#   STEP=oneclock  each reference judged EVALS times in fresh processes at SIZES: the parent's replay estimate's
#               spread against the recorded time's (bench/one_clock.py; ONECLOCK_ARGS passes options)
#   STEP=churn  does a play's window grow after another process frees memory, its own re-allocation or a
#               SIGSTOP (bench/churn.py; CHURN_ARGS passes options)
#   STEP=library  replayed kernels (pipeline.library) against the times the evaluator recorded
#   STEP=batch  7 tasks x 8 samples (BATCH_CONFIG, default examples/config-h100-batch.yaml) with GPU utilisation sampled
#   STEP=builds build seconds per candidate, plain against fast headers, alone and 8 at once (gpu_builds.py;
#               carry .seeds with the seed completions' .txt files; BUILD_ARGS passes options)
#   STEP=evalwall  `kgen eval` wall time of one demo kernel: building, cached, cached with torch.compile's cache
#               emptied (as before the cache was kept), cached again; EVALWALL_PASSES may add served1,
#               served2, ...: judged by a `kgen serve` started before the first of them
#   STEP=grad   forward-plus-backward kernels (fixtures/grad/) in gradient mode, float32 and bfloat16, and a
#               training loop through pipeline.library against plain PyTorch (bench/gpu_grad.py)
#   STEP=triton the Triton backend's red team compiled by Triton's JIT on the GPU (tests/test_triton.py)
#   STEP=ray    unpack the carried Ray (.ray/, made by bench/pack_ray.sh) and start it once
#   STEP=lanes  examples/config-batch.yaml's distinct candidates, pass by pass (LANE_PASSES: cold, local1, local2,
#               ray1, ray2: executor and GPUs), each GPU's utilisation sampled; bench/gpu_lanes.py
# TREE names a carried worktree of another branch to run in (git worktree add .oneclock one-clock).
# Logs go to $OUT (the device tool brings them back).
set -uo pipefail
OUT=${OUT:-/tmp/kgen-out}; mkdir -p "$OUT"
# TREE=.oneclock: every step in another branch's worktree carried beside this one (.whl and kb are ours).
if [ -n "${TREE:-}" ]; then
  cd "$TREE" || exit 1
  for d in .whl kb; do if [ -e "../$d" ] && [ ! -e "$d" ]; then ln -s "../$d" "$d"; fi; done
fi
if [ -d .whl ] && [ -z "${WHEELS_DONE:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
# Every package kgen imports, before any step spends device time on a missing one.
python3 -c 'import openai, sqlite_utils, pydantic, jinja2, click, rich, yaml' || exit 1
kgen() { python3 -m pipeline.cli "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/device.txt"
for step in ${STEP:-tests run bench}; do
  case $step in
    known) for g in $(echo "${CUDA_VISIBLE_DEVICES:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)}" | tr , ' '); do
             CUDA_VISIBLE_DEVICES=$g python3 bench/gpu_known.py "$(date +%T) gpu$g" 2>&1 | tee -a "$OUT/known.log" | grep KNOWN
           done ;;
    ray) mkdir -p /tmp/site && tar -C /tmp/site -xJf .ray/ray-stripped.tar.xz \
           && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .ray/*.whl
         python3 -c 'import ray; ray.init(include_dashboard=False, log_to_driver=False); print("RAY", ray.__version__, ray.cluster_resources()); ray.shutdown()' 2>&1 | tail -3 ;;
    lanes) all=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)
         sed -e "s#^samples: 8#samples: ${LANE_SAMPLES:-4}#" examples/config-batch.yaml > examples/_lanes-local.yaml
         sed -e "s#^executor: local.*#executor: ray#" examples/_lanes-local.yaml > examples/_lanes-ray.yaml
         sed -e "s#^samples: .*#samples: 1#" examples/_lanes-local.yaml > examples/_lanes-fail.yaml
         rm -f db/lanes-passes.txt
         for pass in ${LANE_PASSES:-cold local1 local2}; do
           hog=
           case $pass in
             cold|local2) ex=local vis=$all ;; local1) ex=local vis=0 ;; ray1) ex=ray vis=0 ;; ray2) ex=ray vis=$all ;;
             fail2) ex=fail vis=$all  # the last GPU kept busy by a process of ours: its lane must be retired
                    CUDA_VISIBLE_DEVICES=${all##*,} python3 -c 'import time, torch
x = torch.randn(8192, 8192, device="cuda"); end = time.monotonic() + 300
while time.monotonic() < end: x = torch.tanh(x @ x); torch.cuda.synchronize()' & hog=$!
                    sleep 8 ;;
           esac
           nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader,nounits -lms 500 > "$OUT/util-$pass.csv" &
           smi=$!
           start=$(date +%s)
           CUDA_VISIBLE_DEVICES=$vis timeout ${RUN_LIMIT:-540} python3 -m pipeline.cli run -c "examples/_lanes-$ex.yaml" --new 2>&1 \
             | tee "$OUT/lanes-$pass.log" | tail -6
           echo "LANEPASS $pass ($ex, GPUs $vis): $(( $(date +%s) - start )) s" | tee -a "$OUT/lanes.log"
           kill $smi ${hog}
           echo "$pass" >> db/lanes-passes.txt
         done
         python3 bench/gpu_lanes.py db/batch.db "$OUT" $(cat db/lanes-passes.txt) 2>&1 | tee -a "$OUT/lanes.log"
         cp db/batch.db "$OUT/batch.db" ;;
    runA|runB) tag=${step#run}
         sed "s#db/h100-ab.db#db/h100-$tag.db#" examples/config-h100-ab.yaml > "examples/_h100-$tag.yaml"
         timeout ${RUN_LIMIT:-540} python3 -m pipeline.cli run -c "examples/_h100-$tag.yaml" 2>&1 | tee "$OUT/run$tag.log" | tail -25
         cp "db/h100-$tag.db" "$OUT/h100-$tag.db" ;;
    refine) sed -e "s#^  size: small.*#  size: default#" -e "s#^backend: auto.*#backend: cuda#" \
              -e "s#^database: ../db/kgen.db#database: ../db/h100-refine.db#" examples/config-refine.yaml > examples/_h100-refine.yaml
         start=$(date +%s)
         timeout ${RUN_LIMIT:-540} python3 -m pipeline.cli run -c examples/_h100-refine.yaml 2>&1 | tee "$OUT/refine.log" | tail -25
         echo "refine wall seconds: $(( $(date +%s) - start ))" | tee -a "$OUT/refine.log"
         python3 bench/search_turns.py db/h100-refine.db 2>&1 | tee "$OUT/refine_turns.log"
         cp db/h100-refine.db "$OUT/h100-refine.db" ;;
    builds) for i in 1 2; do  # what a build child pays before any compiler runs: torch's import, no GPU visible
              s=$(date +%s%N); CUDA_VISIBLE_DEVICES= python3 -c 'import torch.utils.cpp_extension'
              echo "STARTUP import torch.utils.cpp_extension: $(( ($(date +%s%N) - s) / 1000000 )) ms" | tee -a "$OUT/builds-startup.log"
            done
            timeout ${BUILD_LIMIT:-480} python3 bench/gpu_builds.py ${BUILD_ARGS:-} $( [ -d .seeds ] && echo --seeds .seeds ) 2>&1 \
              | tee "$OUT/builds.log" | grep -E "^BUILD|PCH|candidates|^[a-z]+-(alone|x)|builds|SKIP" ;;
    grad) db=${GRAD_DB:-$OUT/grad.db}  # GRAD_DB: a carried database of an earlier call's attempts, added to
          timeout ${GRAD_LIMIT:-420} python3 bench/gpu_grad.py --db "$db" ${GRAD_ARGS:-} 2>&1 | tee "$OUT/grad.log" \
              | grep -E "^(BUILD|GRAD|TRAIN)|Traceback|Error"
          [ "$db" = "$OUT/grad.db" ] || cp "$db" "$OUT/grad.db" ;;
    evalwall) python3 -c "import json; from pipeline.generate import extract
e = [json.loads(l) for l in open('fixtures/replay/demo.jsonl') if json.loads(l)['backend'] == 'cuda'][0]
open('/tmp/cand_mse.py', 'w').write(extract.extract(e['text']).code)"
         for pass in ${EVALWALL_PASSES:-build cached cached-cold-compile-cache cached2}; do
           [ $pass = cached-cold-compile-cache ] && rm -rf ~/.cache/kgen/inductor ~/.cache/kgen/triton
           case $pass in served*) [ -z "${srv:-}" ] && { kgen serve -c examples/config-h100.yaml > "$OUT/serve.log" 2>&1 & srv=$!
               until grep -q "kgen serve:" "$OUT/serve.log"; do sleep 0.2; done; } ;; esac
           s=$(date +%s%N)
           # One file for every pass: the device tool brings back at most 8 files from $OUT.
           kgen eval /tmp/cand_mse.py --task mse --backend cuda --size default -c examples/config-h100.yaml --json > "/tmp/evalwall-$pass.json" 2>&1
           echo "EVALWALL $pass $(( ($(date +%s%N) - s) / 1000000 )) ms $(python3 -c "import json, sys
t = open(sys.argv[1]).read(); d = json.loads(t[t.index('{'):t.rindex('}') + 1]); print(d['verdict'], d.get('phases'))" "/tmp/evalwall-$pass.json" 2>&1 | tail -1)" | tee -a "$OUT/evalwall.log"
           { echo "== $pass"; cat "/tmp/evalwall-$pass.json"; } >> "$OUT/evalwall-json.txt"
         done
         [ -n "${srv:-}" ] && { kill $srv; wait $srv; srv=; } ;;
    triton) timeout ${TEST_LIMIT:-420} python3 -m pytest -q -s tests/test_triton.py -rA ${TEST_K:+-k "$TEST_K"} 2>&1 | tee "$OUT/triton.log" \
              | grep -E "TRITON|passed|failed|Error" ;;
    compare) python3 bench/gpu_compare.py db/h100-A.db db/h100-B.db 2>&1 | tee "$OUT/compare.log" ;;
    tests) timeout ${TEST_LIMIT:-420} python3 -m pytest -q -s -m gpu ${TEST_FILES:-tests/test_gpu.py tests/test_honest.py tests/test_big_output.py} -rA ${TEST_K:+-k "$TEST_K"} 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "REDTEAM|HONEST|passed|failed|Error"
           { nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; ps -eo pid,ppid,stat,etime,args; } > "$OUT/after_tests_processes.txt"
           # A pytest stopped by TEST_LIMIT can leave its children's GPU memory behind for a while:
           # the next step waits for it (up to a minute) rather than measure a crowded GPU.
           for _ in $(seq 60); do
             used=$(nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i $CUDA_VISIBLE_DEVICES} --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
             [ "${used:-0}" -lt 1024 ] && break; sleep 1
           done
           echo "after tests: ${used:-?} MiB used on the busiest GPU" | tee -a "$OUT/gpu_tests.log" ;;
    run) timeout ${RUN_LIMIT:-540} python3 -m pipeline.cli run -c examples/config-h100.yaml ${RUN_ARGS:-} 2>&1 | tee "$OUT/run.log" | tail -40
         kgen attempts -c examples/config-h100.yaml --json > "$OUT/attempts.jsonl"
         cp db/h100.db "$OUT/h100.db" ;;
    bench) python3 bench/gpu_bench.py 2>&1 | tee "$OUT/bench.log" ;;
    churn) python3 bench/churn.py ${CHURN_ARGS:-} 2>&1 | tee "$OUT/churn.log" | grep CHURN ;;
    oneclock) python3 bench/one_clock.py ${ONECLOCK_ARGS:-} --out "$OUT/one_clock.json" 2>"$OUT/one_clock.log" | tee "$OUT/one_clock.txt" ;;
    library) python3 bench/gpu_library.py 2>&1 | tee "$OUT/library.log" ;;
    batch) nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 500 > "$OUT/util.csv" &
           smi=$!
           start=$(date +%s)
           cfg=${BATCH_CONFIG:-examples/config-h100-batch.yaml}
           timeout ${BATCH_LIMIT:-540} python3 -m pipeline.cli run -c "$cfg" 2>&1 | tee "$OUT/batch.log" | tail -25
           echo "batch wall seconds: $(( $(date +%s) - start ))" | tee -a "$OUT/batch.log"
           kill $smi
           db=$(python3 -c "import sys; from pipeline.config import load_config; c = load_config(sys.argv[1]); print(c.path(c.database))" "$cfg")
           python3 bench/batch_phases.py "$db" | tee -a "$OUT/batch.log"
           # sqlite's backup, not cp: a copy of the main file alone leaves out what is still in the WAL
           python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
             "$db" "$OUT/batch-$(basename "$db")" ;;
  esac
done
