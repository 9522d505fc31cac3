"""The command line: `kgen` and everything it prints.

May import: core, child, sandbox, generate, build, judge, store, run, library, report.
"""
