"""The command line: `kgen` and everything it prints. It judges only through the drivers in run/,
never by calling the judge or the sandbox itself.

May import: core, child, generate, build, store, run, library, report.
"""
