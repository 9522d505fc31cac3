#!/usr/bin/env bash
# 40th session's cpu battery (run from the tree's root): forged clocks and the bundled references.
PY=/work/main/.venv/bin/python
P=docs/device-logs/2026-12-01-s38-cpu  # dbgi.py; refs3.py is beside this script
for spec in forge-0.5:3 forge-0.6:4 forge-0.7:4 forge-1.0:4; do $PY $P/dbgi.py ${spec%%:*} ${spec##*:}; done
for spec in forge-0.6:3 forge-0.7:3 forge-1.0:3; do TASK=mse SIZE=odd $PY $P/dbgi.py ${spec%%:*} ${spec##*:}; done
for spec in forge-0.5:3 forge-0.6:3 forge-1.0:3; do $PY $P/dbgi.py ${spec%%:*} ${spec##*:} --grad; done
for spec in clock-0.5:3 clock-0.7:3; do TASK=mse SIZE=small $PY $P/dbgi.py ${spec%%:*} ${spec##*:}; done
$PY docs/device-logs/2026-12-01-s38-cpu/refs2.py . 1 odd
$PY docs/device-logs/2026-12-01-s38-cpu/refs2.py . 1 odd grad
