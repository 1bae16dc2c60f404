"""inductor_files: what an inductor entry carries from the build's cache dirs, and how
a fresh process gets it back (Triton's group files rewritten for where they land)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from artifactcache.backends.inductor import files as inductor_files
from artifactcache.backends.inductor.files import (
    TRITON_DIR_PLACEHOLDER,
    install_compiled_files,
    save_compiled_files,
)


def _point_caches(monkeypatch: pytest.MonkeyPatch, root: Path) -> tuple[Path, Path]:
    """Inductor's cache dir at root, Triton's inside it (as fresh_cache sets them)."""
    triton = root / "triton"
    root.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    return root, triton


def _fake_build_dir(root: Path, triton: Path) -> None:
    """What a build's fresh cache dir holds: kernels, sources, tuning winners, Triton."""
    (root / "ab").mkdir(parents=True)
    (root / "ab" / "cabc.so").write_bytes(b"\x7fELF so")
    (root / "ab" / "cabc.o").write_bytes(b"\x7fELF o")
    (root / "ab" / "cabc.py").write_text("# generated source: the graph rewrites it\n")
    (root / "ab" / "tuned.best_config").write_text(json.dumps({"XBLOCK": 64}))
    kernel = triton / "HASH1"
    kernel.mkdir(parents=True)
    (kernel / "k.cubin").write_bytes(b"cubin bytes")
    (kernel / "k.json").write_text(json.dumps({"name": "k", "num_warps": 4}))
    group = {"child_paths": {n: str(kernel / n) for n in ("k.cubin", "k.json")}}
    (kernel / "__grp__k.json").write_text(json.dumps(group))
    (kernel / "lock").write_text("")
    (kernel / "k.json.lock").write_text("")
    (kernel / "tmp.pid_7_abc").mkdir()  # Triton writing a file, to rename it in place
    (kernel / "tmp.pid_7_abc" / "k.ptx").write_bytes(b"half")
    (triton / "tmp.123").mkdir()  # a kernel dir TritonBundler is still writing
    (triton / "tmp.123" / "half.cubin").write_bytes(b"half")


def test_save_keeps_kernels_winners_and_triton_without_the_build_paths(tmp_path, monkeypatch):
    root, triton = _point_caches(monkeypatch, tmp_path / "build")
    _fake_build_dir(root, triton)
    entry = tmp_path / "entry"
    saved = set(save_compiled_files(entry))
    assert saved == {
        "ab/cabc.so",
        "ab/cabc.o",
        "ab/tuned.best_config",
        "triton/HASH1/k.cubin",
        "triton/HASH1/k.json",
        "triton/HASH1/__grp__k.json",
    }
    assert all((entry / rel).is_file() for rel in saved)
    group = (entry / "triton/HASH1/__grp__k.json").read_bytes()
    # The entry names no path of the build machine: it is the same bytes anywhere.
    assert str(tmp_path).encode() not in group and TRITON_DIR_PLACEHOLDER in group


def _saved_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An entry's kernels/ saved from a fake build dir; the caches then point at warm/."""
    root, triton = _point_caches(monkeypatch, tmp_path / "build")
    _fake_build_dir(root, triton)
    entry = tmp_path / "entry"
    save_compiled_files(entry)
    _point_caches(monkeypatch, tmp_path / "warm")
    return entry


def test_install_writes_the_group_for_where_it_lands(tmp_path, monkeypatch):
    entry = _saved_entry(tmp_path, monkeypatch)
    warm_root, warm_triton = tmp_path / "warm", tmp_path / "warm" / "triton"
    assert install_compiled_files(entry) == 6
    assert (warm_root / "ab" / "tuned.best_config").read_text() == json.dumps({"XBLOCK": 64})
    assert not (warm_root / "ab" / "cabc.py").exists()
    group = json.loads((warm_triton / "HASH1" / "__grp__k.json").read_text())
    for name, path in group["child_paths"].items():
        assert Path(path) == warm_triton / "HASH1" / name and Path(path).is_file()
    assert not [p for p in warm_triton.iterdir() if p.name.startswith("tmp.")]
    # A second install finds everything there and writes nothing.
    assert install_compiled_files(entry) == 0


def test_install_keeps_a_kernel_dir_already_there(tmp_path, monkeypatch):
    entry = _saved_entry(tmp_path, monkeypatch)
    warm_triton = tmp_path / "warm" / "triton"
    (warm_triton / "HASH1").mkdir(parents=True)
    (warm_triton / "HASH1" / "k.cubin").write_bytes(b"compiled here")
    install_compiled_files(entry)
    assert (warm_triton / "HASH1" / "k.cubin").read_bytes() == b"compiled here"
    assert not (warm_triton / "HASH1" / "__grp__k.json").exists()


def test_install_of_an_entry_without_kernels_is_a_no_op(tmp_path, monkeypatch):
    _point_caches(monkeypatch, tmp_path / "warm")
    assert install_compiled_files(tmp_path / "entry" / "kernels") == 0


def test_triton_finds_a_carried_group_in_a_new_cache_dir(tmp_path, monkeypatch):
    """Triton's own cache manager, not a copy of its logic, reads the installed group."""
    cache = pytest.importorskip("triton.runtime.cache")
    root, triton = _point_caches(monkeypatch, tmp_path / "build")
    manager = cache.FileCacheManager("KEY42")
    paths = {n: manager.put(b"payload " + n.encode(), n) for n in ("k.cubin", "k.json")}
    manager.put_group("k.json", paths)
    entry = tmp_path / "entry"
    save_compiled_files(entry)

    _point_caches(monkeypatch, tmp_path / "warm")
    install_compiled_files(entry)
    group = cache.FileCacheManager("KEY42").get_group("k.json")
    assert group is not None, "Triton would compile this kernel again"
    assert all(str(tmp_path / "warm") in p for p in group.values())
    assert Path(group["k.cubin"]).read_bytes() == b"payload k.cubin"


def test_the_triton_dir_follows_the_device_when_triton_cache_dir_is_unset(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    assert inductor_files.triton_cache_dir(1) == tmp_path / "triton" / "1"


def test_install_fills_an_empty_kernel_dir_triton_made(tmp_path, monkeypatch):
    entry = _saved_entry(tmp_path, monkeypatch)
    (tmp_path / "warm" / "triton" / "HASH1").mkdir(parents=True)  # Triton's makedirs
    assert install_compiled_files(entry) == 6
    assert (tmp_path / "warm" / "triton" / "HASH1" / "k.cubin").read_bytes() == b"cubin bytes"


def test_a_group_stays_valid_json_wherever_it_lands(tmp_path, monkeypatch):
    """The dir is written into JSON strings escaped, so a quote in it cannot break one."""
    root, triton = _point_caches(monkeypatch, tmp_path / "build")
    _fake_build_dir(root, triton)
    entry = tmp_path / "entry"
    save_compiled_files(entry)
    _, warm_triton = _point_caches(monkeypatch, tmp_path / 'odd "dir"')
    install_compiled_files(entry)
    group = json.loads((warm_triton / "HASH1" / "__grp__k.json").read_text())
    assert all(Path(p).is_file() for p in group["child_paths"].values())
