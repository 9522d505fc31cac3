#!/usr/bin/env bash
# One device call that gives each GPU of a several-GPU machine its own job:
# G0, G1, ... hold the command GPU 0, 1, ... runs (CUDA_VISIBLE_DEVICES set to it alone, OUT
# to its own folder), e.g. G0='STEP="known tests known" bash bench/gpu_check.sh'. A GPU without a
# command idles. SWEEP_GPUS (e.g. "2,3") runs bench/kb_sweep.sh on those GPUs together, one lane each,
# resuming from db/kb-sweep.db. The wheels are installed once, here, before any job starts (two
# installs into one folder at once broke an import). Logs come back packed in $OUT/logs.tgz (the
# device tool brings back at most 8 files), databases beside it.
#   carry: [".whl", "kb", "db/kb-sweep.db"] (".ray" too with EXECUTOR=ray)
set -uo pipefail
FINAL=${OUT:-/tmp/kgen-out}; mkdir -p "$FINAL/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1
pids=()
for g in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
  var=G$g; cmd=${!var:-}
  [ -n "$cmd" ] || continue
  mkdir -p "$FINAL/logs/g$g"
  (export OUT=$FINAL/logs/g$g CUDA_VISIBLE_DEVICES=$g; bash -c "$cmd" > "$OUT/main.log" 2>&1; echo "G$g done rc=$?") &
  pids+=($!)
done
if [ -n "${SWEEP_GPUS:-}" ]; then
  mkdir -p "$FINAL/logs/sweep"
  (OUT=$FINAL/logs/sweep GPUS=$SWEEP_GPUS bash bench/kb_sweep.sh > "$FINAL/logs/sweep/main.log" 2>&1; echo "SWEEP done rc=$?") &
  pids+=($!)
fi
wait "${pids[@]}"
grep -hE "KNOWN|REDTEAM|HONEST|GRAD|passed|failed|Error|batch wall|device peak" "$FINAL"/logs/g*/*.log 2>/dev/null | cut -c1-240 | tail -90
grep -h "stored\|judged" "$FINAL"/logs/g*/batch.log 2>/dev/null | tail -3
head -c 1500 "$FINAL/logs/sweep/sweep-summary.txt" 2>/dev/null; grep -h KNOWN "$FINAL/logs/sweep/known.log" 2>/dev/null
find "$FINAL/logs" -name "*.db" -exec mv {} "$FINAL/" \;
tar -C "$FINAL" -czf "$FINAL/logs.tgz" logs && rm -rf "$FINAL/logs"
ls -la "$FINAL"
