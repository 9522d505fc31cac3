"""Build: candidate code to a BuildResult (the sandboxed build child, fast headers, nvcc split).

May import: core, child, sandbox.
"""
