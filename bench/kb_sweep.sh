#!/usr/bin/env bash
# A KernelBench sweep on a GPU machine (issue 28, item 4): every level 1-3 reference dropped in as its
# own candidate (`class ModelNew(Model): pass`, bench/kb_sweep.py), one lane per visible GPU, judged
# by `kgen run`; per level, how many were correct, flagged, failed or not judged, and the eager and
# torch.compile baselines against KernelBench's published H100 timings (`kgen kernelbench-baselines`).
#
#   run: bash bench/kb_sweep.sh          carry: [".whl", "kb", "db/kb-sweep.db"]  (".ray" with EXECUTOR=ray)
#
# What the call needs that the device machine cannot fetch (it has no network):
#   .whl/   the wheels kgen imports beside torch, as bench/gpu_check.sh installs them.
#   kb/     KernelBench itself: its KernelBench/level1..level3 folders and results/timing/H100_Modal/ (about
#           2 MB). The repository holds only tests/kernelbench (three tasks). From the session's side:
#             git --git-dir "$(fetch github:ScalingIntelligence/KernelBench)" archive HEAD KernelBench results/timing \
#               | (mkdir -p kb && tar -x -C kb)
#           and carry "kb" (or point KB= at another folder that travels).
#   db/kb-sweep.db   the sweep's database from the call before, if any: the sweep resumes from it (the same
#           config's run is found by its plan and only tasks without a stored attempt are judged). Each call
#           copies it to $OUT/kb-sweep.db (DB's name), also when RUN_LIMIT cuts the run short; copy that
#           file to db/ before the next call and carry it.
#
# Settings (environment): KB (checkout, default kb), LEVELS (default "1 2 3"), PROBLEMS (ids or ranges of
# every chosen level, e.g. "1-7"; default all), EXECUTOR (local | ray),
# GPUS (CUDA_VISIBLE_DEVICES for the run: "0" for one lane; default every GPU), DB (default
# db/kb-sweep.db; another name for a throughput pass apart, e.g. GPUS=0 DB=db/kb-one.db),
# RUN_LIMIT (seconds for `kgen run`, default 480: the call's 600 s less installs, known kernels and the copy),
# COMPILE (1: time torch.compile too, default), EVAL (extra evaluation settings, KEY=VALUE ...).
set -uo pipefail
OUT=${OUT:-/tmp/kgen-out}; mkdir -p "$OUT" db
# The device tool brings back at most 8 files: the database, the summary and one archive of the logs.
LOGS=$(mktemp -d); trap 'tar -czf "$OUT/sweep-logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"' EXIT
KB=${KB:-kb}; LEVELS=${LEVELS:-1 2 3}; EXECUTOR=${EXECUTOR:-local}; RUN_LIMIT=${RUN_LIMIT:-480}
DB=${DB:-db/kb-sweep.db}
[ -z "${GPUS:-}" ] || export CUDA_VISIBLE_DEVICES=$GPUS
if [ ! -d "$KB/KernelBench/level1" ] && [ ! -d "$KB/level1" ]; then
  echo "kb_sweep: no KernelBench checkout at $KB (carry one: see the head of bench/kb_sweep.sh)"; exit 2
fi
if [ -d .whl ] && [ -z "${WHEELS_DONE:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -c 'import openai, sqlite_utils, pydantic, jinja2, click, rich, yaml' || exit 1
if [ "$EXECUTOR" = ray ]; then  # the stripped Ray of bench/pack_ray.sh, as gpu_check.sh's ray step
  tar -C /tmp/site -xJf .ray/ray-stripped.tar.xz \
    && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .ray/*.whl || exit 1
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/device.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$LOGS/device.txt"
known() {  # the known kernels on every GPU: start and end must agree within 2% (docs/validation.md)
  for g in $(echo "${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)}" | tr , ' '); do
    CUDA_VISIBLE_DEVICES=$g python3 bench/gpu_known.py "$1 gpu$g" 2>&1 | tee -a "$LOGS/known.log" | grep KNOWN
  done
}
known start
extra=(); [ "${COMPILE:-1}" = 1 ] || extra+=(--no-compile)
# shellcheck disable=SC2206
[ -z "${PROBLEMS:-}" ] || extra+=(--problems $PROBLEMS)
# shellcheck disable=SC2086
python3 bench/kb_sweep.py setup "$KB" sweep --backend cuda --executor "$EXECUTOR" --levels $LEVELS \
  --db "$DB" "${extra[@]}" --eval ${EVAL:-} || exit 1
before=$(python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select count(*) from attempts').fetchone()[0])" "$DB" 2>/dev/null || echo 0)
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 1000 > "$LOGS/util.csv" &
smi=$!
start=$(date +%s)
timeout "$RUN_LIMIT" python3 -m pipeline.cli run -c sweep/sweep.yaml > "$LOGS/sweep.log" 2>&1
rc=$?
wall=$(( $(date +%s) - start ))
kill $smi 2>/dev/null
# carried into the next call, which resumes: sqlite's backup, since a copy of the main file leaves out
# what is still in the WAL (a plain cp once came back empty that way)
python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" "$DB" "$OUT/$(basename "$DB")"
after=$(python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select count(*) from attempts').fetchone()[0])" "$DB")
lanes=$(python3 -c 'from pipeline.run.executor import visible_gpus; print(len(visible_gpus()))')
echo "SWEEP executor=$EXECUTOR lanes=$lanes rc=$rc wall=${wall}s attempts_this_call=$(( after - before )) stored=$after" \
  "per_hour=$(python3 -c "print(round(3600 * ($after - $before) / max($wall, 1), 1))")" | tee "$OUT/sweep-summary.txt"
grep -E "error|refused|not fit|cannot" "$LOGS/sweep.log" | tail -40 > "$LOGS/sweep-problems.txt"
python3 bench/kb_sweep.py summary "$DB" | tee -a "$OUT/sweep-summary.txt"
python3 bench/kb_sweep.py summary "$DB" --json > "$LOGS/sweep-summary.json"
python3 -m pipeline.cli kernelbench-baselines "$KB" --db "$DB" | tee "$LOGS/kb-baselines.txt" | tee -a "$OUT/sweep-summary.txt"
python3 bench/batch_phases.py "$DB" > "$LOGS/phases.txt" 2>&1; head -30 "$LOGS/phases.txt" >> "$OUT/sweep-summary.txt"
python3 -m pipeline.cli kernelbench-baselines "$KB" --db "$DB" --json > "$LOGS/kb-baselines.jsonl"
known end
