#!/usr/bin/env bash
# One device call that uses every GPU of a several-GPU machine at once (docs/benchmarks.md, 21st session):
# GPU 0 runs bench/gpu_check.sh's steps (ONE_STEPS, e.g. "known tests known" or "known batch known"),
# the others run the KernelBench sweep (bench/kb_sweep.sh, one lane each, resuming from db/kb-sweep.db).
# Logs are packed into $OUT/logs.tgz (the device tool brings back at most 8 files); the sweep's
# database comes back as $OUT/kb-sweep.db.
#   carry: [".whl", "kb", "db/kb-sweep.db"] (".ray" too with EXECUTOR=ray)
set -uo pipefail
FINAL=${OUT:-/tmp/kgen-out}; mkdir -p "$FINAL/one" "$FINAL/sweep"
all=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)
rest=${all#*,}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
(OUT=$FINAL/one CUDA_VISIBLE_DEVICES=0 STEP="${ONE_STEPS:-known tests known}" bash bench/gpu_check.sh \
   > "$FINAL/one/main.log" 2>&1; echo "ONE done rc=$?") &
one=$!
if [ -n "${SWEEP:-1}" ] && [ "$rest" != "$all" ]; then
  (OUT=$FINAL/sweep GPUS=$rest bash bench/kb_sweep.sh > "$FINAL/sweep/main.log" 2>&1; echo "SWEEP done rc=$?") &
  sweep=$!
fi
wait $one ${sweep:-}
grep -hE "KNOWN|REDTEAM|HONEST|passed|failed|Error|batch wall|attempts|GRAD" "$FINAL/one/"*.log | cut -c1-300 | tail -70
cat "$FINAL/sweep/sweep-summary.txt" 2>/dev/null; grep KNOWN "$FINAL/sweep/known.log" 2>/dev/null
tail -5 "$FINAL/sweep/main.log"
mv "$FINAL/sweep/kb-sweep.db" "$FINAL/kb-sweep.db" 2>/dev/null
for f in "$FINAL"/one/*.db; do [ -e "$f" ] && mv "$f" "$FINAL/"; done
tar -C "$FINAL" -czf "$FINAL/logs.tgz" one sweep && rm -rf "$FINAL/one" "$FINAL/sweep"
ls -la "$FINAL"
