"""The CUDA defaults are the fast path: inductor reduce-overhead, and coordinate-descent
tuning for inductor and aoti; each is in the key and can be turned off."""

from __future__ import annotations

import pytest

from artifactcache.backends.base import get_backend
from artifactcache.backends.shared.tuning import inductor_tuning
from artifactcache.choices import BuildChoices
from artifactcache.errors import AcacheError
from artifactcache.recipes import load_recipe

pytest.importorskip("torch")

CUDA = BuildChoices(device="cuda", dtype="bf16")


def test_inductor_defaults_to_cuda_graphs_on_cuda_and_plain_on_cpu():
    from artifactcache.backends.inductor.compiling import compile_options, inductor_mode

    assert inductor_mode(CUDA) == "reduce-overhead"
    assert inductor_mode(BuildChoices()) == "default"
    assert compile_options(CUDA) == {"triton.cudagraphs": True, "coordinate_descent_tuning": True}
    assert compile_options(BuildChoices()) == {}
    off = BuildChoices(device="cuda", dtype="bf16", mode="default",
                       extra={"coordinate_descent_tuning": "0"})  # fmt: skip
    assert compile_options(off) == {}


@pytest.mark.parametrize("backend", ["inductor", "aoti"])
def test_tuning_is_a_key_factor_and_can_be_turned_off(backend):
    b = get_backend(backend)
    recipe = load_recipe("tiny-llama")
    on = b.factors(recipe, CUDA)
    off_opts = BuildChoices(device="cuda", dtype="bf16", extra={"coordinate_descent_tuning": 0})
    b.check_options(off_opts)
    off = b.factors(recipe, off_opts)
    assert on["codegen"]["inductor_config"]["coordinate_descent_tuning"] is True
    assert "coordinate_descent_tuning" not in off["codegen"]["inductor_config"]
    assert (
        "coordinate_descent_tuning"
        not in b.factors(recipe, BuildChoices())["codegen"]["inductor_config"]
    )


@pytest.mark.parametrize("backend", ["inductor", "aoti"])
@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (BuildChoices(extra={"coordinate_descent_tuning": 1}), "only CUDA builds have"),
        (BuildChoices(device="cuda", extra={"coordinate_descent_tuning": "maybe"}), "0 or 1"),
        (BuildChoices(extra={"unroll": 1}), "takes no extra option unroll"),
    ],
)
def test_bad_tuning_options_are_one_line(backend, opts, message):
    with pytest.raises(AcacheError, match=message) as e:
        get_backend(backend).check_options(opts)
    assert "\n" not in str(e.value)


def test_flag_spellings():
    def tuned(value: object) -> bool:
        opts = BuildChoices(device="cuda", extra={"coordinate_descent_tuning": value})
        return bool(inductor_tuning(opts))

    assert all(tuned(v) for v in (True, 1, "1", "true", "on"))
    assert not any(tuned(v) for v in (False, 0, "0", "false", "off"))


def test_only_decode_is_tuned():
    from artifactcache.backends.inductor.compiling import pass_options
    from artifactcache.backends.shared.tuning import decode_only

    cfg = {"coordinate_descent_tuning": True, "max_autotune": True}
    assert decode_only(cfg, "decode") == cfg
    assert decode_only(cfg, "prefill") == decode_only(cfg, "extend") == {"max_autotune": True}
    on_cuda = {"triton.cudagraphs": True, "coordinate_descent_tuning": True}
    # The passes: neither graphs nor tuning, and no pad_mm (its guard on the token count
    # broke tiny-llama-2k's CUDA build: pass_options says why).
    assert pass_options(on_cuda) == {"shape_padding": False}
