"""The kernel library: replaying the best verified kernels, choosing them, exporting them.

    from pipeline import library
    mse = library.load("mse")

May import: core, child, store.
"""

__all__ = ["load", "functional", "describe", "export_best", "LibraryError", "KgenFallbackWarning", "KgenModule",
           "Description"]


def __getattr__(name: str):
    """The library's public face (pipeline.library.replay), imported on first use: a module that needs
    only export or kernels does not pay for torch's import."""
    if name in __all__:
        from . import replay

        return getattr(replay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
