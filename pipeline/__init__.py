"""kgen: LLM-driven kernel generation with a verdict you can trust.

The stages, each a folder with its own import rule (in its __init__; tests/test_boundary.py checks
them all): child (the trust boundary), sandbox, generate, build, judge, store, run, library, report,
cli. The core beside them (records, config, policy, backends, bundled, leaderboard) is shared by all.

May import: child.

Nothing is imported here eagerly: a candidate's child imports pipeline.child.harness, and through it
this file, so the parent's side must not come along. The public names load on first use.
"""

__all__ = ["load", "describe", "functional", "Config", "EvalResult", "Verdict"]

_WHERE = {"load": "library.replay", "describe": "library.replay", "functional": "library.replay",
          "Config": "config", "EvalResult": "records", "Verdict": "records"}


def __getattr__(name: str):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
