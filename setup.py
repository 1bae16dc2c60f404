"""Build hook: the wheel carries the top-level recipes/ folder as package data.

Everything else is in pyproject.toml. The built-in recipes live in recipes/ at the
repository root; setuptools only packages data found inside a package, so build_py
copies them to artifactcache/recipes/ in the build tree, where recipes.py finds them
in an installed (non-editable) package. A checkout reads recipes/ directly.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RECIPES = Path(__file__).resolve().parent / "recipes"


class BuildPyWithRecipes(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "artifactcache" / "recipes"
        target.mkdir(parents=True, exist_ok=True)
        for src in sorted(RECIPES.glob("*.toml")):
            shutil.copy2(src, target / src.name)


setup(cmdclass={"build_py": BuildPyWithRecipes})
