"""`kgen doctor`: each layer of a candidate's room and the tools, as pipeline.run.doctor finds them."""

from __future__ import annotations

import sys

import click


@click.command()
def doctor() -> None:
    """Check this host: each layer of a candidate's room (allowed or not, and how to allow it), then
    the GPU, driver, nvcc, Triton and torch. Exit 0 when every layer a room needs holds."""
    from ..run.doctor import report

    lines, ok = report()
    for line in lines:
        click.echo(line)
    sys.exit(0 if ok else 1)
