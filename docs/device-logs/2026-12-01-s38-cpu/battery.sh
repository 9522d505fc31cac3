#!/usr/bin/env bash
# The 38th session's cpu battery: the red team's forged clock at 0.5-1.0 and the bundled references, on one tree.
PY=/work/main/.venv/bin/python
P=/tmp/s38
for spec in forge-0.5:3 forge-0.6:4 forge-0.7:3 forge-1.0:4; do $PY $P/dbgi.py ${spec%%:*} ${spec##*:}; done
for spec in forge-0.6:3 forge-1.0:3; do TASK=mse SIZE=odd $PY $P/dbgi.py ${spec%%:*} ${spec##*:}; done
for spec in forge-0.5:3 forge-0.6:3 forge-1.0:3; do $PY $P/dbgi.py ${spec%%:*} ${spec##*:} --grad; done
$PY $P/refs2.py . 1 odd
$PY $P/refs2.py . 1 odd grad
