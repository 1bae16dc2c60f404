"""benchmarks/variant_agreement.py: labelled builds of one backend through
backend_evidence.py's agreement(), on CPU with eager entries of tiny-llama."""

from __future__ import annotations

from pathlib import Path

import pytest
from _bench_scripts import load_script

from artifactcache import api


def test_a_variant_names_its_backend_cache_and_extras():
    agreement = load_script("variant_agreement")
    name, backend, cache, extra = agreement.parse_variant("plain=inductor:/c:layer_regions=0,x=1")
    assert (name, backend, cache) == ("plain", "inductor", Path("/c"))
    assert extra == {"layer_regions": "0", "x": "1"}
    assert agreement.parse_variant("r=aoti:/c")[3] == {}
    with pytest.raises(SystemExit, match="expected NAME=BACKEND:CACHE_DIR"):
        agreement.parse_variant("nocache")


def test_two_builds_of_one_backend_compare_side_by_side(tmp_path: Path):
    evidence = load_script("backend_evidence")
    common = {"device": "cpu", "dtype": "fp32"}
    same, other, ref = tmp_path / "same", tmp_path / "other", tmp_path / "ref"
    api.build("tiny-llama", "eager", cache_dir=same, **common)
    api.build("tiny-llama", "eager", cache_dir=other, seed=1, **common)
    variants = {
        "same": {"backend": "eager", "cache_dir": same},
        "other": {"backend": "eager", "cache_dir": other, "seed": 1},
    }
    found = evidence.agreement("tiny-llama", variants, {**common, "cache_dir": ref}, 6, 1e-4)
    assert list(found) == ["same", "other"]
    assert found["same"]["max_rel_err"] == 0.0 and found["same"]["tokens_equal"]
    # Other weights: a large error, and both labels kept though the backend is one.
    assert found["other"]["max_rel_err"] > 1e-2 and not found["other"]["within_rtol"]
    assert len(found["other"]["tokens"]) == 6
    # The script's own comparison adds the first variant's tokens as a second reference.
    script = load_script("variant_agreement")
    rows = script.compare(
        "tiny-llama", [("a", "eager", same, {}), ("b", "eager", same, {})], common, ref, 6, 1e-4
    )
    assert list(rows) == ["variants"]  # fp32: no yardstick
    b = rows["variants"]["b"]
    assert b["first_token_differing_from_first_variant"] is None
    assert b["backend"] == "eager" and b["max_rel_err"] == 0.0
    with pytest.raises(SystemExit, match="'eager' names the reference"):
        script.parse_variant("eager=eager:/c")
