"""Prompts: a jinja2 template per strategy in prompts/, rendered for one task and backend.

    text = render("one_shot.j2", task, "cuda", Path("prompts"))
    request_messages = messages(text)

The template gets `task_name`, `task_source` (the reference file's full text), `backend`
("cuda", "triton" or "cpu") and the worked example for that backend, `example_model` and
`example_model_new`, read from prompts/examples/model.py and {backend}_model_new.py (in gradient
mode {backend}_model_new_grad.py, a torch.autograd.Function with kernels both ways), `grad` and
`dtype` (the run's evaluation mode).
Rendering is strict: a variable the template names but is not given is an error, never an
empty string in a prompt sent to a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import (Environment, FileSystemLoader, StrictUndefined, Template, TemplateNotFound,
                    TemplateSyntaxError, UndefinedError)

from pipeline.backends import BACKENDS
from pipeline.child.tasks import TaskFile

EXAMPLES_DIR = "examples"


class PromptError(ValueError):
    """A prompt that cannot be rendered; the message names the template or file."""


def example_paths(backend: str, prompts_dir: Path, grad: bool = False) -> tuple[Path, Path]:
    """The worked example for a backend: (reference model, its optimized ModelNew). Both backends
    start from the same reference model; only the optimized version differs."""
    examples = Path(prompts_dir) / EXAMPLES_DIR
    return examples / "model.py", examples / f"{backend}_model_new{'_grad' if grad else ''}.py"


def _environment(prompts_dir: Path) -> Environment:
    """Strict: a variable a template names but is not given is an error, never an empty string."""
    return Environment(loader=FileSystemLoader(prompts_dir), undefined=StrictUndefined,
                       keep_trailing_newline=True)


def render(template: str, task: TaskFile, backend: str, prompts_dir: Path, grad: bool = False,
           dtype: str = "float32") -> str:
    """The prompt text for `task` on `backend` from the template file `template` in `prompts_dir`,
    for the run's evaluation mode (gradient mode, dtype)."""
    prompts_dir = Path(prompts_dir)
    if backend not in BACKENDS:
        raise PromptError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    tmpl = load(template, prompts_dir)
    examples = []
    for path in example_paths(backend, prompts_dir, grad):
        if not path.is_file():
            raise PromptError(f"prompt example {path.name!r} not found in {path.parent}")
        examples.append(path.read_text())
    return fill(tmpl, template, task_name=task.name, task_source=task.source, backend=backend,
                example_model=examples[0], example_model_new=examples[1], grad=grad, dtype=dtype)


def render_file(template: str, prompts_dir: Path, **context: Any) -> str:
    """Any template in `prompts_dir` (the feedback and evolve ones too) with `context`, strictly."""
    return fill(load(template, Path(prompts_dir)), template, **context)


def load(template: str, prompts_dir: Path) -> Template:
    try:
        return _environment(prompts_dir).get_template(template)
    except TemplateNotFound:
        raise PromptError(f"prompt template {template!r} not found in {prompts_dir}") from None
    except TemplateSyntaxError as exc:
        raise PromptError(f"prompt template {template!r} line {exc.lineno}: {exc.message}") from None


def fill(tmpl: Template, template: str, **context: Any) -> str:
    try:
        return tmpl.render(**context)
    except UndefinedError as exc:
        raise PromptError(f"prompt template {template!r}: {exc.message}") from None
    except TemplateSyntaxError as exc:  # an {% include %} of a broken file surfaces at render time
        raise PromptError(f"prompt template {exc.name or template!r} line {exc.lineno}: "
                          f"{exc.message}") from None


def messages(text: str) -> list[dict[str, str]]:
    """The chat messages for one prompt: a single user turn."""
    return [{"role": "user", "content": text}]
