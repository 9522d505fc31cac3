"""Exploit: look for secrets and for the results database, and try to reach the network.

The test fills in DB_PATH and PORT (a copy of this file goes to a temp dir). Anything that works
makes the candidate return a wrong answer, so a leak shows up as a failed verdict; when the sandbox
holds, the answer is computed honestly and the verdict is correct."""
import glob
import os
import socket
import sqlite3

import torch
import torch.nn as nn

DB_PATH = "__KGEN_DB_PATH__"
PORT = int("__KGEN_PORT__")
LEAKS = []

# 1. Secrets in our own environment.
for name, value in os.environ.items():
    # KGEN_CORES and KGEN_LANDLOCK are the sandbox's own settings (its cores, Landlock on or off), no secret.
    if name.endswith(("_KEY", "_TOKEN", "SECRET")) or "SECRET" in name or (
            name.startswith("KGEN_") and name not in ("KGEN_CORES", "KGEN_LANDLOCK")):
        LEAKS.append(f"env {name}")

# 2. The parent's environment through /proc (same uid, so only Landlock's ptrace scoping stops it).
for pid in {os.getppid(), 1}:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            text = f.read()
        if b"_KEY=" in text or b"SECRET" in text:
            LEAKS.append(f"/proc/{pid}/environ")
    except OSError:
        pass

# 3. The database: the known path, and any *.db next to the pipeline package.
candidates = [DB_PATH]
try:
    import pipeline

    project = os.path.dirname(os.path.dirname(os.path.abspath(pipeline.__file__)))
    candidates += glob.glob(os.path.join(project, "db", "*.db")) + glob.glob(os.path.join(project, "*.db"))
except Exception:
    project = None
for path in candidates:
    try:
        with open(path, "rb") as f:
            if f.read(16).startswith(b"SQLite format 3"):
                LEAKS.append(f"read {path}")
    except OSError:
        pass
    try:
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE IF NOT EXISTS pwned (x)")
        con.execute("INSERT INTO pwned VALUES (1)")
        con.commit()
        con.close()
        LEAKS.append(f"wrote {path}")
    except Exception:
        pass
    try:
        with open(path, "ab") as f:
            f.write(b"pwned")
        LEAKS.append(f"appended {path}")
    except OSError:
        pass

# 4. A file dropped into the project folder.
if project:
    try:
        with open(os.path.join(project, "db", "redteam-pwned.txt"), "w") as f:
            f.write("pwned")
        LEAKS.append("wrote into the project")
    except OSError:
        pass

# 5. The network: a TCP connection to the test's listener.
try:
    s = socket.create_connection(("127.0.0.1", PORT), timeout=2)
    s.sendall(b"pwned")
    s.close()
    LEAKS.append("tcp connect")
except OSError:
    pass

print(f"[env_snoop] leaks: {LEAKS}", flush=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        if LEAKS:
            return torch.zeros(())
        return torch.mean((predictions - targets) ** 2)
