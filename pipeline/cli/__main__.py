"""`python -m pipeline.cli`: the kgen command, as the tests and the device scripts run it."""

from .main import main

main()
