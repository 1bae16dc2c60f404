"""aoti's export of a step: a refused dynamic KV length is one line, not torch's report."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import UserError, UserErrorType

from artifactcache.backends import aoti
from artifactcache.errors import BackendError
from artifactcache.recipes import load_recipe


def test_a_refused_dynamic_dimension_is_one_line(monkeypatch):
    report = (
        "Constraints violated (kv_len)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
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
