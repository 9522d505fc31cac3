"""The jail: what confines a candidate's process before any of its code runs. jail.py runs in a fork of
the zygote (pipeline.child.zygote) and loads landlock.py and seccomp.py by path, so that the three
stay the standard library alone, as small as a reader can check.

May import: nothing (the standard library only).
"""
