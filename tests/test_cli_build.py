"""`acache recipes`, `acache build`, and bad input to `acache run`, through the real Typer app
(generation itself: tests/test_cli_run.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from artifactcache.api.results import build_phases, phases_summary
from artifactcache.cli.app import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_user_error(result, contains: str) -> None:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert contains in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def _entries(root: Path) -> list[Path]:
    return list((root / "v1" / "entries").rglob("manifest.json"))


def test_recipes_lists_builtins():
    r = run("recipes")
    assert r.exit_code == 0 and "tiny-llama" in r.stdout and "mistral-7b" in r.stdout
    data = json.loads(run("recipes", "--json").stdout)
    by_name = {d["name"]: d for d in data}
    assert by_name["llama-7b"]["model"]["dim"] == 4096
    assert by_name["tiny-phi-2"]["family"] == "phi-2"


def test_build_then_hit(cache_dir: Path):
    first = run("build", "tiny-llama", "--backend", "eager", "--json")
    assert first.exit_code == 0, first.stderr
    a = json.loads(first.stdout)
    assert a["status"] == "built" and len(a["key"]) == 64 and a["bytes"] > 0
    assert Path(a["path"]).is_relative_to(cache_dir)
    second = run("build", "tiny-llama", "--backend", "eager")
    assert second.exit_code == 0
    key, status = second.stdout.split()[:2]
    assert key == a["key"] and status == "hit"
    forced = json.loads(run("build", "tiny-llama", "--force", "--json").stdout)
    assert forced["status"] == "built" and forced["key"] == a["key"]


def test_a_build_prints_its_phases_and_a_hit_none(cache_dir: Path, monkeypatch, tmp_path):
    from artifactcache import api
    from artifactcache.api.results import BuildResult
    from artifactcache.store.entry import Entry

    meta = {"compile_seconds": {"model": 0.4, "prefill": 5.06, "decode": 3.0, "wall": 8.6}}
    entry = Entry(key="ab" * 32, path=tmp_path, manifest={"meta": meta})
    built = BuildResult(key=entry.key, built=True, seconds=8.7, bytes=1, entry=entry)
    monkeypatch.setattr(api, "build", lambda *a, **k: built)
    r = run("build", "tiny-llama", "--backend", "eager")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split()[:2] == [entry.key, "built"]
    assert "build phases" not in r.stdout  # stdout: the key line only
    assert "build phases: model 0.4 s · prefill 5.1 s · decode 3.0 s · wall 8.6 s" in r.stderr
    j = json.loads(run("build", "tiny-llama", "--backend", "eager", "--json").stdout)
    assert j["phases"] == meta["compile_seconds"]
    monkeypatch.undo()
    run("build", "tiny-llama", "--backend", "eager")
    hit = run("build", "tiny-llama", "--backend", "eager", "--json")
    assert json.loads(hit.stdout)["phases"] == {} and "build phases" not in hit.stderr


def test_phases_summary_shows_the_top_level_phases():
    aoti = {
        "compiler_probe": 5.17, "decode": 85.06, "decode_compile": 80.1, "decode_export": 4.9,
        "prefill": 79.8, "prefill_compile": 72.9, "wall": 90.08,
    }  # fmt: skip
    assert phases_summary(aoti, steps_at_once=3) == (
        "build phases: compiler_probe 5.2 s · decode 85.1 s · prefill 79.8 s · wall 90.1 s"
        " (3 steps at once; --json has all 7)"
    )
    wall_first = {"wall": 3.5, "model": 0.4, "decode": 3.0}  # as sorted on disk
    assert phases_summary(wall_first) == "build phases: model 0.4 s · decode 3.0 s · wall 3.5 s"
    assert phases_summary({}) == ""


def test_build_phases_reads_what_a_backend_recorded():
    assert build_phases({"compile_seconds": {"a": 1, "b": 2.5, "note": "x", "f": True}}) == {
        "a": 1.0, "b": 2.5,
    }  # fmt: skip
    assert build_phases({"compile_seconds": 12.5}) == {"compile": 12.5}  # the module backends'
    assert build_phases({}) == {}


# Regions asked of a build whose default puts the rope inside the split-KV kernel.
PHI3_CUDA_REGIONS = [
    "build", "tiny-phi-3", "-b", "inductor", "--device", "cuda", "--extra", "layer_regions=1"
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "contains"),
    [
        (["run", "tiny-llama", "--tokens", "1,x"], "--tokens must be integers"),
        (["run", "tiny-llama", "--tokens", "1", "--prompt", "hi"], "not both"),
        (["run", "tiny-llama", "--prompt", "Something else"], "pass token ids with --tokens"),
        (["run", "tiny-llama", "--tokens", "1", "--max-new-tokens", "500"], "max_seq_len"),
        (["run", "tiny-llama", "--tokens", ",".join(["1"] * 70)], "70 prompt + 1 new tokens"),
        (["run", "tiny-llama", "--tokens", "99999", "--max-new-tokens", "2"], "vocabulary"),
        (["build", "no-such-recipe"], "unknown recipe"),
        (["build", "tiny-llama", "--backend", "nope"], "unknown backend"),
        (["build", "tiny-llama", "--dtype", "fp8"], "unknown dtype"),
        (["build", "tiny-llama", "-b", "inductor", "--mode", "reduce-overhead"], "cuda"),
        (["build", "tiny-llama", "--weights", "/nonexistent/ckpt"], "weights not found"),
        (["build", "tiny-llama", "--quant", "int4"], "unknown --quant 'int4'"),
        (["build", "tiny-llama", "-b", "trt", "--quant", "int8wo"], "Q/DQ"),
        (["build", "tiny-phi-3", "--extra", "fuse_projections=0"], "cannot split them"),
        (["build", "tiny-llama", "--extra", "fuse_projections=2"], "expected 0 or 1"),
        # phi-3's one-row CUDA inductor build runs the rope inside split-KV by default
        (PHI3_CUDA_REGIONS, "add --extra split_kv_rope=0"),
        (["run", "tiny-llama", "--tokens", "1", "--quant", "int8"], "unknown --quant"),
        (["key", "tiny-llama", "-b", "ort", "--quant", "int8wo"], "constant folding"),
    ],
)
def test_bad_inputs_exit_1_with_one_line(args, contains, cache_dir: Path, monkeypatch):
    # No tokenizer download attempts: the prompt path must fail locally and fast.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_user_error(run(*args), contains)
    if args[0] == "build":
        assert _entries(cache_dir) == []


def test_extra_options_are_parsed_typed_and_validated():
    from artifactcache.cli.app import parse_backend_extras, parse_extra
    from artifactcache.errors import ArgumentError

    assert parse_extra(["opset=18", "allow_host_code=true", "exporter=torchscript", "n=-2"]) == {
        "opset": 18,
        "allow_host_code": True,
        "exporter": "torchscript",
        "n": -2,
    }
    assert parse_extra(["x=--5"]) == {"x": "--5"}  # not a number: kept as text, no crash
    with pytest.raises(ArgumentError, match="KEY=VALUE"):
        parse_extra(["opset"])
    assert parse_backend_extras(
        ["ort:opset=19", "ort:exporter=torchscript", "trt:opt_level=3"]
    ) == {
        "ort": {"opset": 19, "exporter": "torchscript"},
        "trt": {"opt_level": 3},
    }
    with pytest.raises(ArgumentError, match="BACKEND:KEY=VALUE"):
        parse_backend_extras(["opset=19"])


def test_key_with_extra_is_the_key_build_stores_under(cache_dir: Path):
    pytest.importorskip("onnxruntime")
    extra = ["--extra", "exporter=torchscript"]  # the fast exporter: a build in seconds
    plain = json.loads(run("key", "tiny-llama", "-b", "ort", "--json").stdout)
    keyed = json.loads(run("key", "tiny-llama", "-b", "ort", *extra, "--json").stdout)
    assert keyed["key"] != plain["key"]
    assert keyed["factors"]["backend"]["options"]["export"]["exporter"] == "torchscript"
    built = run("build", "tiny-llama", "-b", "ort", *extra, "--json")
    assert built.exit_code == 0, built.stderr
    assert json.loads(built.stdout)["key"] == keyed["key"]
    shown = json.loads(run("show", keyed["key"], "--json").stdout)
    assert shown["manifest"]["factors"] == keyed["factors"]


def test_help_groups_commands_in_panels_newcomers_first():
    import re

    from artifactcache.cli.app import HELP_PANELS

    out = runner.invoke(app, ["--help"], env={"COLUMNS": "120"}).stdout
    panels = re.findall(r"^╭─ (.+?) ─", out, flags=re.M)
    assert panels == ["Options", "Build and run", "Measure", "Cache", "Remote", "Diagnose"]
    # Within the first panel, the order a newcomer needs them.
    first = out.split("Build and run", 1)[1].split("╰", 1)[0]
    names = re.findall(r"^│ (\w+) ", first, flags=re.M)
    assert names[:4] == ["recipes", "build", "run", "key"]
    registered = {c.name for c in app.registered_commands}
    grouped = {c for cmds in HELP_PANELS.values() for c in cmds}
    assert registered == grouped  # every command has its panel, and no panel names a ghost


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["ls"],
        ["stats"],
        ["prune"],
        ["verify"],
        ["gc", "--max-size", "1T", "--dry-run"],
        ["show", "12345678"],
        ["diff", "12345678", "87654321"],
        ["rm", "12345678"],
    ],
    ids=" ".join,
)
def test_help_and_cache_commands_do_not_import_torch(argv, cache_dir: Path):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from artifactcache.cli.app import app\n"
        "try:\n"
        "    app(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('torch', 'numpy', 'onnx', 'onnxruntime') if m in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120
    )
    assert r.stdout.strip().splitlines()[-1] == "[]", (r.stdout, r.stderr)


def test_quant_builds_its_own_entry_and_key_explains_it(cache_dir: Path):
    plain = json.loads(run("build", "tiny-llama", "--json").stdout)
    quant = json.loads(run("build", "tiny-llama", "--quant", "int8wo", "--json").stdout)
    assert quant["status"] == "built" and quant["key"] != plain["key"]
    keyed = run("key", "tiny-llama", "-b", "eager", "--quant", "int8wo", "--json")
    keyed = json.loads(keyed.stdout)
    assert keyed["key"] == quant["key"]
    assert keyed["factors"]["backend"]["options"]["quant"] == "int8wo"
    assert json.loads(run("build", "tiny-llama", "--quant", "int8wo", "--json").stdout)[
        "status"] == "hit"  # fmt: skip
    int4 = json.loads(run("build", "tiny-llama", "--quant", "int4wo", "--json").stdout)
    assert int4["status"] == "built" and int4["key"] not in (plain["key"], quant["key"])


def test_a_slow_build_says_what_it_does_off_a_terminal_and_lines_stay_whole(
    cache_dir: Path, monkeypatch
):
    from artifactcache.cli import render

    monkeypatch.setattr(render, "PLAIN_PROGRESS_AFTER_S", 0.0)  # every build counts as slow
    r = runner.invoke(app, ["build", "tiny-llama", "-b", "eager"], env={"COLUMNS": ""})
    assert r.exit_code == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == "building tiny-llama with eager ..."
    assert lines[-1].startswith("building tiny-llama with eager: ") and lines[-1].endswith(" s")
    # Piped, the key, status, time and size stay one line (not wrapped at 80 columns).
    (out,) = r.stdout.strip().splitlines()
    assert len(out) > 80 and out.split()[1] == "built"
    monkeypatch.setattr(render, "PLAIN_PROGRESS_AFTER_S", 60.0)
    hit = runner.invoke(app, ["build", "tiny-llama", "-b", "eager"])
    assert hit.exit_code == 0 and hit.stderr == ""  # a quick hit stays quiet


def test_a_broken_blake3_fails_in_one_line_before_any_build(tmp_path, monkeypatch):
    """blake3 hashes every entry's files: a broken install is told when the store opens,
    not after a build (with a traceback) when its files are hashed; nothing is written."""
    monkeypatch.setitem(sys.modules, "blake3", None)  # an import of it raises ImportError
    cache = tmp_path / "cache"
    r = run("build", "tiny-llama", "-b", "eager", "--device", "cpu", "--cache-dir", cache)
    assert_user_error(r, "blake3 cannot be imported")
    assert "pip install" in r.stderr
    assert not cache.exists()


@pytest.mark.parametrize("name", ["ACACHE_LAZY_STEPS", "ACACHE_CUDA_GRAPHS"])
def test_a_bad_load_time_setting_fails_before_any_build(tmp_path, monkeypatch, name):
    """Read only when an entry loads, yet checked with the arguments: a typo never
    costs a build first; nothing is written."""
    monkeypatch.setenv(name, "maybe")
    cache = tmp_path / "cache"
    for command in (["build"], ["run", "--tokens", "1,2", "--new-tokens", "2"]):
        r = run(*command[:1], "tiny-llama", "-b", "eager", "--device", "cpu",
                "--cache-dir", cache, *command[1:])  # fmt: skip
        assert_user_error(r, f"{name}='maybe' is not a boolean")
        assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))
