"""Which layer of the room (pipeline/child/jail/jail.py) stops CUDA from starting: the full policy,
then each layer left out in turn (on the device machine; one line a variant)."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipeline.sandbox import cgroup, confine  # noqa: E402

CODE = "import torch; torch.cuda.init(); print('CUDA', torch.cuda.device_count(), torch.empty(1, device='cuda').item())"


def variant(name: str, change) -> None:
    work = Path(tempfile.mkdtemp(prefix="kgen-child-"))
    os.chmod(work, 0o711)
    for sub in ("tmp", "job", "py"):
        (work / sub).mkdir()
    os.chown(work / "tmp", 65534, 65534)
    room = cgroup.make(work.name, 4096, 32 << 30)
    policy = confine.jail_policy(work, ["pipeline"], [], [], True, room=room, file_bytes=4 << 30, home_bytes=2 << 30)
    policy = change(policy)
    r, w = os.pipe()
    cmd = confine.jail_command(policy, w, [sys.executable, "-c", CODE])
    p = subprocess.run(cmd, pass_fds=(w,), capture_output=True, text=True, cwd=work / "tmp",
                       env={**os.environ, "HOME": str(work / "tmp")}, timeout=120)
    os.close(w)
    status = os.read(r, 10000).decode().strip()
    os.close(r)
    tail = (p.stdout + p.stderr).strip().splitlines()[-1:]
    print(f"ROOM {name}: rc={p.returncode} out={tail} status={status[:300]}", flush=True)
    if room:
        room.remove()


def without_mask(folder):
    return lambda p: {**p, "masks": [m for m in p["masks"] if m[0] != folder]}


variant("full", lambda p: p)
variant("unix sockets allowed", lambda p: {**p, "unix_sockets": True})
variant("no /proc of its own", lambda p: {**p, "own_proc_mount": False})
variant("/run not masked", without_mask("/run"))
variant("no cgroup", lambda p: {**p, "cgroups": [], "require": [r for r in p["require"] if r != "cgroup"]})
variant("no namespaces", lambda p: {**p, "room": False, "require": ["filesystem", "seccomp"]})
variant("unix + /run not masked", lambda p: without_mask("/run")({**p, "unix_sockets": True}))
