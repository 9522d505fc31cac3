"""What a run reports as it goes: the records its runner hands to `on_event` (the CLI's progress shows
them; pipeline.cli.progress)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunStart:
    """What a run is about to do: the first thing Progress reports."""

    run_id: str
    resumed: bool
    tasks: int
    models: int
    samples: int
    backend: str
    strategy: str
    stored: int
    """Attempts of this run already in the database (a resume does not redo them)."""
    todo: int
    """Slots still to do (a search's later turns come on top)."""
    build_workers: int | None = None
    """Builds at once, where the executor says."""
