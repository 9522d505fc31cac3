"""The jail: what confines a candidate's process before its interpreter starts. jail.py runs as
`python -I -S jail.py` and loads landlock.py and seccomp.py by path, before any package exists.

May import: nothing (the standard library only).
"""
