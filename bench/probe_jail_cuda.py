"""Which layer of the jail (pipeline/sandbox/confine.py) stops CUDA from starting: each layer alone, then all.

    python3 bench/probe_jail_cuda.py      (on the device machine; prints one line a variant)
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipeline.sandbox import confine  # noqa: E402

CODE = "import torch; torch.cuda.init(); print('CUDA', torch.cuda.device_count(), torch.empty(1, device='cuda').item())"
print(subprocess.run(["ls", "-l", "/dev/"], capture_output=True, text=True).stdout)
print(subprocess.run("ls -l /dev/nvidia* /dev/nvidia-caps 2>&1", shell=True, capture_output=True, text=True).stdout)
work = Path(tempfile.mkdtemp(prefix="kgen-child-"))
os.chmod(work, 0o711)
for sub in ("tmp", "job", "py"):
    (work / sub).mkdir()
os.chown(work / "tmp", 65534, 65534)
full = confine.jail_policy(work, ["pipeline"], [], [], True)
ll = {"rules": full["rules"], "require": []}
variants = {"landlock": ll}
for where in ("/proc", "/proc/self/", "/sys", "/run", "/var", "/tmp", "/dev/shm", "/etc", "/usr", "/opt", "/root", "/home"):
    variants[f"ll+write {where}"] = ({**ll, "own_proc": "write"} if where == "/proc/self/"
                                     else {**ll, "rules": ll["rules"] + [(where, "write")]})
for name, policy in variants.items():
    r, w = os.pipe()
    cmd = confine.jail_command(policy, w, [sys.executable, "-c", CODE])
    p = subprocess.run(cmd, pass_fds=(w,), capture_output=True, text=True, cwd=work / "tmp",
                       env={**os.environ, "HOME": str(work / "tmp")}, timeout=120)
    os.close(w)
    status = os.read(r, 10000).decode().strip()
    os.close(r)
    tail = (p.stdout + p.stderr).strip().splitlines()[-2:]
    print(f"JAIL {name}: rc={p.returncode} status={status} out={tail}", flush=True)
