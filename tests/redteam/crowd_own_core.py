"""Exploit: buy time past a step's limit. A step's limit counts the time the child could run: what
its main thread waited on a run queue is added (pipeline.judge.session.Session.ask). So the first
call forks three spinners onto the child's own core and spins beside them: the main thread is
runnable three quarters of the time and waits the rest, and never replies. What it may buy is the
ceiling (evaluation.step_ceiling_s), never the child's whole timeout."""
import os

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        for _ in range(3):
            if os.fork() == 0:
                while True:
                    pass
        os.write(1, f"KGEN-NOTE crowd {os.getpid()}\n".encode())
        while True:
            pass
