"""Exploit: never return, and leave helpers behind. One forked helper stays in the process group;
another tries to leave it the daemon way: setsid() (a new session, out of reach of the killpg that
ends a timed-out child), else setpgid() to a group of its own, then a double fork so the survivor
is orphaned and reparented away. A process that outlives its evaluation keeps burning the CPU or GPU
under every later candidate's timing. Each process writes its pid, its group and (the escaper)
whether setsid worked to its output, which the parent keeps (EvalResult.output) for the test, with
its pid namespace (the room's: its pids are the room's numbers, which mean nothing outside)."""
import os
import time

import torch.nn as nn


def _note(tag, extra=""):
    ns = os.stat("/proc/self/ns/pid").st_ino  # its pid namespace: the room's, seen the same from outside
    os.write(1, f"KGEN-NOTE {tag} {os.getpid()} {os.getpgid(0)} {ns} {extra}\n".encode())


def _spin_forever():
    while True:
        time.sleep(0.2)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        if os.fork() == 0:
            _note("helper")
            _spin_forever()
        if os.fork() == 0:
            try:
                os.setsid()
                how = "setsid"
            except OSError:
                os.setpgid(0, 0)
                how = "setpgid"
            if os.fork() == 0:
                _note("escaper", how)
                _spin_forever()
            os._exit(0)
        _note("child")
        while True:
            pass
