"""The trust boundary: everything that runs inside a candidate's process.

The harness imports the candidate; tasks (input generation from a seed) and sizes, timing, the hold
and the protocol run beside it and can be read or rebound by it. So nothing here is believed by the
parent on its word: the parent (pipeline.evaluate and pipeline.judge) checks every value in the
candidate's outputs against a float64 reference and bounds every time with its own clock.

Nothing in this package imports from the parent's side (store, config, llm, run, evaluate, judge,
records): tests/test_boundary.py checks that rule.
"""
