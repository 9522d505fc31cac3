"""Run: the drivers below the CLI (a batch, its search, executors and lanes, `kgen eval`, serve).

May import: core, child, sandbox, generate, build, judge, store.
"""
