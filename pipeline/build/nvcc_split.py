"""nvcc's own steps for one .cu, with the host front end beside the device compile instead of before
it, so their seconds overlap (docs/decisions/builds-and-headers.md). ninja runs it in a candidate's build
child as torch's PYTORCH_NVCC:

    python -I -S nvcc_split.py NVCC ARGS...

nvcc runs its steps one at a time: gcc -E and cudafe++ (the host side's front end), gcc -E, cicc,
ptxas and fatbinary (the device code), then gcc -c on cudafe++'s output with the fatbinary embedded.
The front ends each parse every header the .cu includes, so each costs seconds; only one file joins
the two chains: the module id that cudafe++ writes and cicc reads. cicc can write that file too, and
writes the same id for the same source. Here it writes its own, both chains run at once, and the ids
are compared: where they differ, or the device chain fails, the device chain runs again exactly as nvcc
wrote it, from cudafe++'s id. Every step is nvcc's own command from `nvcc --dryrun`, so the object is
the one nvcc makes. Anything but that one plan (several architectures, dependency files, a step this
does not know) is left to nvcc itself. Standard library only: it starts in tens of milliseconds.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HOST, DEVICE = ("host_pre", "cudafe"), ("device_pre", "cicc", "ptxas", "fatbinary")
MARK = "[kgen-nvcc]"  # not "[kgen]": build.failure_line must not take this line for a failure's cause


def role(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        return "unknown"
    if not words:
        return "unknown"
    name = os.path.basename(words[0])
    if name in ("cudafe++", "cicc", "ptxas", "fatbinary", "rm"):
        return "cudafe" if name == "cudafe++" else name
    if "-E" in words:
        return "device_pre" if any(w.startswith("-D__CUDA_ARCH__=") for w in words) else "host_pre"
    if "-c" in words:
        return "compile"
    return "unknown"


def module_id_file(command: str) -> str | None:
    words = shlex.split(command)
    if "--module_id_file_name" not in words:
        return None
    at = words.index("--module_id_file_name")
    return words[at + 1] if at + 1 < len(words) else None


def read_dry_run(dry_run: str) -> tuple[list[str], dict[str, str], list[str]] | None:
    """The dry run's assignments, its steps by role and nvcc's own other lines (its warnings), or None
    where the steps are not exactly one host chain, one device chain and the compile after them."""
    assignments, steps, other, order = [], {}, [], []
    for line in dry_run.splitlines():
        if not line.startswith("#$ "):
            if line.strip():
                other.append(line)
            continue
        body = line[3:]
        if ASSIGNMENT.match(body):
            assignments.append(body)
            continue
        kind = role(body)
        if kind == "unknown" or kind in steps:
            return None
        steps[kind] = body
        order.append(kind)
    if set(steps) - {"rm"} != {*HOST, *DEVICE, "compile"} or order[-1] != "compile":
        return None
    made = module_id_file(steps["cudafe"])
    if "--gen_module_id_file" not in shlex.split(steps["cudafe"]) or made is None \
            or module_id_file(steps["cicc"]) != made or "--gen_module_id_file" in shlex.split(steps["cicc"]):
        return None
    return assignments, steps, other


def own_id(cicc: str, made: str) -> str | None:
    """cicc's command writing its own module id beside cudafe++'s, or None if the text is unexpected."""
    old = f"--module_id_file_name {shlex.quote(made)}"
    for spelling in (old, f'--module_id_file_name "{made}"'):
        if cicc.count(spelling) == 1:
            return cicc.replace(spelling, f'--gen_module_id_file --module_id_file_name "{made}.cicc"')
    return None


class Chain(threading.Thread):
    """Steps run one after another, as nvcc would, with their output kept until it is printed."""

    def __init__(self, assignments: list[str], commands: list[str]):
        super().__init__(daemon=True)
        # nvcc's assignments are its own syntax, not the shell's (`LIBRARIES=  "-L..." "-L..."`): like
        # nvcc, put them in the steps' environment as written; the steps read $CICC_PATH, PATH, ...
        self.env = {**os.environ, **dict(a.split("=", 1) for a in assignments)}
        self.commands, self.output, self.code = commands, "", 0

    def run(self) -> None:
        for command in self.commands:
            done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=self.env)
            self.output += done.stdout + done.stderr
            if done.returncode:
                self.code = done.returncode
                return


def split(nvcc: str, args: list[str]) -> int | None:
    """Compile as nvcc would, the chains side by side; None where nvcc must do it alone."""
    scratch = tempfile.mkdtemp(prefix="kgen-nvcc-")
    try:
        # nvcc names its intermediate files after its own pid under TMPDIR: a private folder keeps two
        # builds' names apart after the dry run's process has gone. Only the dry run's environment
        # until the plan is known: nvcc alone (the fallback) runs after the folder is removed.
        env = {**os.environ, "TMPDIR": scratch}
        dry = subprocess.run([nvcc, "--dryrun", *args], capture_output=True, text=True, env=env)
        found = read_dry_run(dry.stdout + dry.stderr) if dry.returncode == 0 else None
        if found is None:
            return None
        assignments, steps, other = found
        cicc = own_id(steps["cicc"], module_id_file(steps["cudafe"]))
        if cicc is None:
            return None
        os.environ["TMPDIR"] = scratch
        started = time.monotonic()
        # nvcc's `rm` of a .fatbin that fatbinary never wrote is done by nvcc itself, which ignores
        # that it is missing; the scratch folder goes at the end anyway.
        device = [steps[k] for k in DEVICE]
        host = Chain(assignments, [steps[k] for k in HOST])
        side = Chain(assignments, [steps["device_pre"], cicc, *device[2:]])
        host.start(), side.start()
        host.join(), side.join()
        sys.stderr.write("".join(line + "\n" for line in other))
        if host.code:
            sys.stdout.write(host.output)
            return host.code
        made = module_id_file(steps["cudafe"])
        same = side.code == 0 and _read(made) == _read(made + ".cicc") != b""
        if not same:  # nvcc's own device chain, from cudafe++'s id
            side = Chain(assignments, device)
            side.run()
        sys.stdout.write(host.output + side.output)
        if side.code:
            return side.code
        last = Chain(assignments, [steps["compile"]])
        last.run()
        sys.stdout.write(last.output)
        print(f"{MARK} host and device steps {'side by side' if same else 'one after another'}; "
              f"{time.monotonic() - started:.1f} s", flush=True)
        return last.code
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: nvcc_split.py NVCC ARGS...", file=sys.stderr)
        return 2
    nvcc, args = argv[1], argv[2:]
    code = split(nvcc, args)
    if code is None:
        return subprocess.run([nvcc, *args]).returncode
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
