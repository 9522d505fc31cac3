"""The trust boundary: everything that runs inside a candidate's process, where the candidate can
read or rebind it. So the parent (pipeline.judge) believes nothing from here on its word: it checks
every output against a float64 reference and bounds every time with its own clock.

May import: nothing (pipeline.child's own modules only: never store, config, llm, run, judge or
records, which the candidate could reach through sys.modules; tests/test_boundary.py checks it).
"""

from pathlib import Path

HARNESS = __name__ + ".harness"
"""The module every candidate's child runs (`python -m`): the one spelling of its path."""
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The folder that holds the pipeline package: the child imports kgen from here and nowhere else."""
