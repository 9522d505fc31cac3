"""Store: the results database (store: the write side, queries: the read side, migrations).

May import: core.
"""
