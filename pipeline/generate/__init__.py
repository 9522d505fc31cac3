"""Generate: a task to candidate code (prompts, the model call, extraction, a verdict as feedback).

May import: core, child.
"""
