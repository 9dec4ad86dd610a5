"""The wheel carries the repository's files the package reads at run time that are not Python
modules (sp00ky_infra/shared/shipped.py: NAMES) under sp00ky_infra/shipped/. Everything else
about the package is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NAMES = ("cloud-init", "Pulumi.yaml", "__main__.py", "stacks")


class BuildWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads them in the checkout
        target = Path(self.build_lib) / "sp00ky_infra" / "shipped"
        for name in NAMES:
            source = ROOT / name
            if source.is_dir():
                ignore = shutil.ignore_patterns("__pycache__")
                shutil.copytree(source, target / name, ignore=ignore, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)


setup(cmdclass={"build_py": BuildWithShippedFiles})
