cd /work/main
P=".venv/bin/python bench/cpu_judge_probe.py"
$P forge-0.6 --grad --runs 10 > /tmp/s35/cpu/s30-grad-forge-0.6.log 2>&1
$P forge-1.0 --grad --runs 5 > /tmp/s35/cpu/s30-grad-forge-1.0.log 2>&1
$P forge-0.5 --grad --runs 3 > /tmp/s35/cpu/s30-grad-forge-0.5.log 2>&1
$P grad_honest_fast_mse.py --grad --runs 10 --load spin > /tmp/s35/cpu/s30-grad-fast-spin.log 2>&1
.venv/bin/python docs/device-logs/2026-11-30-s34-cpu/grad_refs.py . 2 > /tmp/s35/cpu/s30-grad-refs-odd.log 2>&1
