"""The wheel carries the top-level recipes/ as package data; a checkout reads recipes/."""

import subprocess
import sys
from pathlib import Path

from artifactcache import recipes

REPO = Path(__file__).resolve().parents[1]


def test_build_copies_every_builtin_recipe_into_the_package(tmp_path):
    subprocess.run(
        # egg_info's scratch goes to tmp_path too, so the checkout stays clean.
        [
            sys.executable,
            "setup.py",
            "-q",
            "egg_info",
            "--egg-base",
            str(tmp_path),
            "build_py",
            "--build-lib",
            str(tmp_path),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    shipped = sorted(p.name for p in (tmp_path / "artifactcache" / "recipes").glob("*.toml"))
    assert shipped == sorted(p.name for p in (REPO / "recipes").glob("*.toml"))
    assert "tiny-llama.toml" in shipped


def test_a_checkout_reads_the_top_level_recipes_folder():
    assert recipes.BUILTIN_DIR == REPO / "recipes"
    assert "llama-7b" in recipes.builtin_names()
