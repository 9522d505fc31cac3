"""Judge: a built candidate to an EvalResult (the bench, the session with the child, the checks).

May import: core, child, sandbox.
"""
