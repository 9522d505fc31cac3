"""The wheel's one step that pyproject.toml cannot say: copy the bundled data kgen reads at run time
(the reference tasks, prompts, demo fixtures and the demo's config, which live at the repository's
top level beside pipeline/) into the package as pipeline/_bundled/, where pipeline.bundled finds it
once installed. A source checkout or an editable install reads them where they are."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLED = ["reference_tasks", "prompts", "fixtures", "config.yaml", "examples/config-refine.yaml"]


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # -e: pipeline.bundled reads the checkout itself
            return
        here = Path(__file__).resolve().parent
        target = Path(self.build_lib) / "pipeline" / "_bundled"
        for name in BUNDLED:
            source, dest = here / name, target / name
            if source.is_dir():
                shutil.copytree(source, dest, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest)


setup(cmdclass={"build_py": BuildWithData})
