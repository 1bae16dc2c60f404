"""aoti's export of a step: a refused dynamic KV length is one line, not torch's report."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import UserError, UserErrorType

from artifactcache.backends.aoti import backend as aoti
from artifactcache.backends.shared.steps import example_inputs
from artifactcache.errors import BackendError
from artifactcache.models import build_model
from artifactcache.recipes import load_recipe


def test_a_refused_dynamic_dimension_is_one_line(monkeypatch):
    report = (
        'Constraints violated (kv_len)! For more information, run with TORCH_LOGS="+dynamic".\n'
        "  - Not all values of kv_len = L['kv_pos'].size()[0] in the specified range ..."
    )

    def refuse(*args, **kwargs):
        raise UserError(UserErrorType.CONSTRAINT_VIOLATION, report)

    monkeypatch.setattr(torch.export, "export", refuse)
    recipe = load_recipe("tiny-llama")
    with pytest.raises(BackendError) as e:
        aoti.export_step(torch.nn.Identity(), (torch.zeros(1),), recipe, "decode")
    msg = str(e.value)
    assert "\n" not in msg
    assert "Constraints violated (kv_len)" in msg and "--max-seq-len" in msg


def test_other_export_failures_pass_through(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the model")

    monkeypatch.setattr(torch.export, "export", broken)
    recipe = load_recipe("tiny-llama")
    with pytest.raises(RuntimeError, match="a bug in the model"):
        aoti.export_step(torch.nn.Identity(), (torch.zeros(1),), recipe, "decode")


def _long(tmp_path):
    from _generate_util import write_recipe

    return load_recipe(write_recipe(tmp_path, max_seq_len=1024, max_positions=1024))


def _refusing_strict_dims(monkeypatch, narrow=None):
    """torch.export refusing a named Dim, as on the H200; a Dim.DYNAMIC export goes
    through (over ``narrow``, a narrower range, where given)."""
    real = torch.export.export
    calls = []

    def export(model, args, dynamic_shapes=None, **kwargs):
        kv = dynamic_shapes[-1][0]
        calls.append(type(kv).__name__)
        if isinstance(kv, torch.export.Dim):
            raise UserError(UserErrorType.CONSTRAINT_VIOLATION, "Constraints violated (kv_len)!")
        if narrow is not None:
            dynamic_shapes = (
                None,
                None,
                None,
                {0: torch.export.Dim("kv_len", min=narrow[0], max=narrow[1])},
            )
        return real(model, args, dynamic_shapes=dynamic_shapes, **kwargs)

    monkeypatch.setattr(torch.export, "export", export)
    return calls


def test_a_refused_range_is_exported_with_a_runtime_check_instead(tmp_path, monkeypatch):
    recipe = _long(tmp_path)
    model = build_model(recipe)
    calls = _refusing_strict_dims(monkeypatch)
    args = example_inputs(recipe, torch.device("cpu"), "decode")
    with torch.no_grad():
        ep = aoti.export_step(model, args, recipe, "decode")
    assert calls == ["Dim", "_DimHint"]
    assert aoti.exported_range(ep, -1, 0) == (256, 1024)


def test_a_range_export_narrows_is_refused(tmp_path, monkeypatch):
    recipe = _long(tmp_path)
    model = build_model(recipe)
    _refusing_strict_dims(monkeypatch, narrow=(256, 512))
    args = example_inputs(recipe, torch.device("cpu"), "decode")
    with torch.no_grad(), pytest.raises(BackendError) as e:
        aoti.export_step(model, args, recipe, "decode")
    assert "\n" not in str(e.value) and "(256, 512) of (256, 1024)" in str(e.value)
