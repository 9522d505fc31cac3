"""Report: `kgen report`'s page and charts, and KernelBench's metrics.

May import: core.
"""
