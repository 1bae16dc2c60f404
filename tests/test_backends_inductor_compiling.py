"""inductor/compiling.py without a compile: how the build workers' staged files merge."""

from __future__ import annotations

import json
from pathlib import Path

from artifactcache.backends.inductor import compiling
from artifactcache.backends.inductor.compiling import (
    ARTIFACTS,
    KERNELS,
    MEGACACHE,
    STEP_FILES,
    STEPS,
    merge_worker_files,
    step_megacache,
)


def _stage(scratch: Path, step: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        f = scratch / step / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


def _best(coordesc: bool, block: int) -> str:
    return json.dumps({"XBLOCK": block, "found_by_coordesc": coordesc})


def test_the_merge_keeps_each_kernel_once_and_the_coordinate_descent_winner(tmp_path: Path):
    scratch, workdir = tmp_path / "steps", tmp_path / "entry"
    workdir.mkdir()
    for step in STEPS:
        (workdir / STEP_FILES[step]).write_bytes(b"fn-" + step.encode())
    k = f"{KERNELS}/ab/k1.best_config"  # a kernel all three steps use
    j = f"{KERNELS}/cd/k2.best_config"  # one the passes tuned only by coordinate descent
    shared = f"{KERNELS}/triton/h1/kernel.cubin"
    _stage(scratch, "prefill", {k: _best(False, 1), j: _best(True, 8), shared: "cubin"})
    _stage(scratch, "extend", {k: _best(False, 2), j: _best(False, 16), shared: "cubin"})
    _stage(scratch, "decode", {k: _best(True, 4), ARTIFACTS: json.dumps({"autotune": 10})})
    _stage(scratch, "decode", {MEGACACHE: "mega"})
    _stage(scratch, "extend", {ARTIFACTS: json.dumps({"autotune": 5, "inductor": 3})})
    record = merge_worker_files(scratch, workdir)
    kept = workdir / KERNELS
    assert json.loads((kept / "ab/k1.best_config").read_text())["XBLOCK"] == 4  # decode's
    assert json.loads((kept / "cd/k2.best_config").read_text())["XBLOCK"] == 8  # coordesc
    assert (kept / "triton/h1/kernel.cubin").read_text() == "cubin"
    assert record["kernels"] == ["ab/k1.best_config", "cd/k2.best_config", "triton/h1/kernel.cubin"]
    assert (workdir / step_megacache("decode")).read_text() == "mega"
    assert record["megacache_bytes"] == 4
    assert record["cache_artifacts"] == {"autotune": 15, "inductor": 3}
    assert record["steps"] == {STEP_FILES[s]: len(f"fn-{s}") for s in STEPS}


def test_a_later_plain_winner_replaces_an_earlier_plain_one(tmp_path: Path):
    later, earlier = tmp_path / "later.best_config", tmp_path / "earlier.best_config"
    earlier.write_text(_best(False, 1))
    later.write_text(_best(False, 2))
    assert compiling._keeps(later, over=earlier)
    earlier.write_text(_best(True, 1))
    assert not compiling._keeps(later, over=earlier)
    earlier.write_text("not json")  # unreadable: not a coordinate-descent result
    assert compiling._keeps(later, over=earlier)
