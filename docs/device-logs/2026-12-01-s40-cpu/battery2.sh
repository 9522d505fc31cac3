#!/usr/bin/env bash
# Honest ratios beside two busy loops (--load spin), and honest_fast_mse idle.
PY=/work/main/.venv/bin/python
P=docs/device-logs/2026-12-01-s38-cpu  # dbgi.py; refs3.py is beside this script
$PY $P/dbgi.py forge-1.0 4 --load spin
TASK=mse SIZE=odd $PY $P/dbgi.py forge-1.0 3 --load spin
$PY $P/dbgi.py forge-1.0 3 --grad --load spin
TASK=mse SIZE=small $PY $P/dbgi.py honest_fast_mse.py 3 --load spin
TASK=mse SIZE=small $PY $P/dbgi.py honest_fast_mse.py 3
