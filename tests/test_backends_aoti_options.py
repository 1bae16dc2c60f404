"""aoti's --extra wrapper_opt: a key factor when given, torch's default when not, and
one line for a bad level."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from artifactcache.backends.aoti.options import CONFIG_NAME, wrapper_configs, wrapper_opt
from artifactcache.backends.base import get_backend
from artifactcache.choices import BuildChoices
from artifactcache.errors import AcacheError
from artifactcache.recipes import load_recipe

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]


def _opts(**extra: object) -> BuildChoices:
    return BuildChoices(device="cuda", dtype="bf16", extra=dict(extra))


def test_left_out_the_key_and_config_are_torchs_default():
    b = get_backend("aoti")
    recipe = load_recipe("tiny-llama")
    assert wrapper_opt(_opts()) is None
    assert CONFIG_NAME not in b.factors(recipe, _opts())["codegen"]["inductor_config"]


def test_each_level_is_its_own_key():
    b = get_backend("aoti")
    recipe = load_recipe("tiny-llama")
    seen = {}
    for level in ("O0", "o1"):
        opts = _opts(wrapper_opt=level)
        b.check_options(opts)
        seen[level] = b.factors(recipe, opts)["codegen"]["inductor_config"][CONFIG_NAME]
    assert seen == {"O0": "O0", "o1": "O1"}
    assert wrapper_configs(_opts(wrapper_opt="O0")) == {CONFIG_NAME: "O0"}


def test_the_level_reaches_every_step(monkeypatch):
    """decode_only strips tuning flags from the passes, not the wrapper's level."""
    from artifactcache.backends.shared.tuning import decode_only

    monkeypatch.setattr("artifactcache.backends.aoti.backend.choose_cxx", lambda **_: None)
    from artifactcache.backends.aoti.backend import inductor_configs

    cfg = inductor_configs(_opts(wrapper_opt="O0"))
    for step in ("prefill", "extend", "decode"):
        assert decode_only(cfg, step)[CONFIG_NAME] == "O0"


@pytest.mark.parametrize("value", ["O3", "fast", ""])
def test_a_bad_level_is_one_line(value):
    with pytest.raises(AcacheError, match="wrapper_opt must be one of O0, O1") as e:
        get_backend("aoti").check_options(_opts(wrapper_opt=value))
    assert "\n" not in str(e.value)


def test_other_backends_refuse_it():
    with pytest.raises(AcacheError, match="takes no extra option wrapper_opt"):
        get_backend("inductor").check_options(_opts(wrapper_opt="O0"))


def test_a_torch_without_the_setting_is_one_line(monkeypatch):
    import torch._inductor.config as inductor_config

    from artifactcache.backends.aoti.options import check_wrapper_opt_supported

    monkeypatch.delattr(inductor_config.aot_inductor, CONFIG_NAME.rsplit(".", 1)[1])
    with pytest.raises(AcacheError, match=f"has no {CONFIG_NAME}") as e:
        check_wrapper_opt_supported(_opts(wrapper_opt="O0"))
    assert "\n" not in str(e.value)
    check_wrapper_opt_supported(_opts())  # left out: nothing to check


def test_checking_the_option_imports_no_inductor():
    """check_options runs on every warm load: importing Inductor's config there cost a
    warm llama-7b load 1.35 s on the H100 (attempt 52)."""
    code = (
        "import sys, torch\n"
        "from artifactcache.backends.base import get_backend\n"
        "from artifactcache.choices import BuildChoices\n"
        "opts = BuildChoices(extra={'wrapper_opt': 'O0'})\n"
        "get_backend('aoti').check_options(opts)\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._inductor')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout  # fmt: skip
    assert out.strip() == "[]", out
