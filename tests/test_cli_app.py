"""Every bad argument of every command: exit 1, one line, and the cache exactly as it was;
and help texts shown as written.

Each case runs twice: against a cache that holds an entry (the tree is snapshotted,
contents and mtimes, before and after) and against a cache root that does not exist
yet (it must still not exist). The measurement commands must not spawn a probe.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.measure import coldstart
from artifactcache.recipes import BUILTIN_DIR

runner = CliRunner()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root: kind, mode, and for files their bytes' digest and mtime."""
    if not root.exists():
        return {}
    out: dict[str, tuple] = {".": (os.lstat(root).st_mode,)}
    for p in sorted(root.rglob("*")):
        st = os.lstat(p)
        rel = str(p.relative_to(root))
        if p.is_file() and not p.is_symlink():
            out[rel] = (st.st_mode, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            out[rel] = (st.st_mode,)
    return out


@pytest.fixture(scope="module")
def populated(tmp_path_factory) -> tuple[Path, str]:
    """A cache root holding one eager entry, and that entry's key."""
    root = tmp_path_factory.mktemp("populated")
    os.chmod(root, 0o700)
    r = runner.invoke(app, ["build", "tiny-llama", "--json", "--cache-dir", str(root)])
    assert r.exit_code == 0, r.stderr
    return root, json.loads(r.stdout)["key"]


def _with_max_batch(tmp_path: Path, rows: int) -> Path:
    text = (BUILTIN_DIR / "tiny-llama.toml").read_text()
    assert "max_batch = 1" in text
    path = tmp_path / f"batch{rows}.toml"
    path.write_text(text.replace("max_batch = 1", f"max_batch = {rows}"))
    return path


@pytest.fixture
def batch0_recipe(tmp_path) -> Path:
    return _with_max_batch(tmp_path, 0)


@pytest.fixture(autouse=True)
def no_spawn(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a probe was spawned before the arguments were checked")

    monkeypatch.setattr(coldstart, "spawn_probe", boom)


S3 = ["--remote", "s3://bucket/prefix"]
TOO_LONG = ",".join(["1"] * 70)  # past tiny-llama's max_seq_len 64
RUN = ["run", "tiny-llama", "-b", "eager"]
OUT = "OUT"  # replaced by a path under tmp_path that must not be created
COMPARE = ["compare", "--recipes", "tiny-llama", "--backends", "eager", "--out", OUT]

CASES = [
    # run: the generation request is checked before the entry is built or loaded
    ([*RUN, "--tokens", "1,2", "--max-new-tokens", "-1"], "(--new-tokens) must be at least 1"),
    ([*RUN, "--tokens", "1,2", "--max-new-tokens", "0"], "(--new-tokens) must be at least"),
    ([*RUN, "--tokens", "1,99999", "--max-new-tokens", "2"], "outside the vocabulary"),
    ([*RUN, "--tokens", "-5", "--max-new-tokens", "2"], "outside the vocabulary"),
    ([*RUN, "--tokens", ","], "--tokens is empty"),
    ([*RUN, "--tokens", TOO_LONG], "max_seq_len"),
    ([*RUN, "--tokens", "1", "--max-new-tokens", "500"], "max_seq_len"),
    ([*RUN, "--tokens", "1", "--mode", "fast"], "has no modes"),
    ([*RUN, "--tokens", "1", "--dtype", "fp8"], "unknown dtype"),
    ([*RUN, "--tokens", "1", "--device", "cuda:x"], "unknown device"),
    ([*RUN, "--tokens", "1", "--extra", "foo"], "expected KEY=VALUE"),
    ([*RUN, "--tokens", "1", "--extra", "foo=1"], "takes no extra options"),
    # --extra cudnn_prefill: CUDA's, for the torch backends, a 0/1 flag
    (["build", "tiny-llama", "-b", "aoti", "--extra", "cudnn_prefill=1"], "needs --device cuda"),
    (["key", "tiny-llama", "-b", "eager", "--extra", "cudnn_prefill=maybe"], "expected 0 or 1"),
    (["build", "tiny-llama", "-b", "ort", "--extra", "cudnn_prefill=0"], "cudnn_prefill"),
    # --extra wrapper_opt: aoti's own, O0 or O1
    (["build", "tiny-llama", "-b", "aoti", "--extra", "wrapper_opt=O3"], "must be one of O0, O1"),
    (["build", "tiny-llama", "-b", "inductor", "--extra", "wrapper_opt=O0"], "wrapper_opt"),
    # --extra split_kv_rope: inside the split-KV kernel only, for the torch backends
    (
        ["build", "tiny-llama", "-b", "inductor", "--extra", "split_kv_rope=1"],
        "add --extra split_kv_decode=1",
    ),
    (["key", "tiny-llama", "-b", "ort", "--extra", "split_kv_rope=1"], "split_kv_rope"),
    (
        [
            "build",
            "tiny-llama",
            "-b",
            "inductor",
            "--device",
            "cuda",
            "--extra",
            "split_kv_rope=1",
            "--extra",
            "layer_regions=1",
        ],
        "cannot take --extra split_kv_rope=1",
    ),
    # --extra layer_regions: inductor's own, a 0/1 flag
    (["build", "tiny-llama", "-b", "inductor", "--extra", "layer_regions=2"], "expected 0 or 1"),
    (["build", "tiny-llama", "-b", "aoti", "--extra", "layer_regions=1"], "layer_regions"),
    ([*RUN, "--tokens", "1", "--weights", "/nonexistent/ckpt"], "weights not found"),
    (["run", "tiny-llama", "-b", "nope", "--tokens", "1"], "unknown backend"),
    (["run", "tiny-llama", "-b", "ort", "--dtype", "fp16", "--tokens", "1"], "supports dtype"),
    # build
    (["build", "no-such-recipe"], "unknown recipe"),
    (["build", "tiny-llama", "-b", "eager", "--extra", "=3"], "expected KEY=VALUE"),
    (["build", "tiny-llama", "-b", "aoti", "--mode", "nope"], "unknown aoti mode"),
    (["build", "tiny-llama", "-b", "inductor", "--mode", "reduce-overhead"], "--device cuda"),
    (["build", "tiny-llama", "-b", "ort", "--dtype", "bf16"], "supports dtype"),
    (["build", "tiny-llama", "--weights", "/nonexistent/ckpt"], "weights not found"),
    (["build", "BATCH0", "-b", "eager"], "'shapes.max_batch' must be positive"),
    # key
    (["key", "tiny-llama", "-b", "nope"], "unknown backend"),
    (["key", "tiny-llama", "-b", "eager", "--extra", "foo=1"], "takes no extra options"),
    (["key", "tiny-llama", "-b", "ort", "--extra", "opset=abc"], "opset"),
    (["key", "tiny-llama", "-b", "eager", "--weights", "/nonexistent/ckpt"], "weights not found"),
    # bench
    (["bench", "tiny-llama", "--iters", "0"], "--iters"),
    (["bench", "tiny-llama", "--warmup", "0"], "--warmup"),
    (["bench", "tiny-llama", "--batch", "0"], "--batch"),
    (["bench", "tiny-llama", "--batch", "2", "--max-batch", "1"], "exceeds the artifact's max_"),
    (["bench", "tiny-llama", "--batch", "1,8", "--max-batch", "4"], "a batch of 8 exceeds"),
    (["bench", "tiny-llama", "--batch", "1,x"], "--batch takes batch sizes"),
    (["bench", "tiny-llama", "--batch", "2,2"], "names a size twice"),
    (["bench", "tiny-llama", "--batch", ","], "at least one batch size"),
    (["bench", "tiny-llama", "--batch", "1,-2"], "at least 1, got -2"),
    (["bench", "tiny-llama", "--batch", "1,2", "--new-tokens", "59"], "max_seq_len"),
    (["bench", "tiny-llama", "--batch", "1", "--batches", "2"], "old spelling --batches"),
    ([*RUN, "--tokens", "1", "--new-tokens", "2", "--max-new-tokens", "3"], "disagree"),
    (["bench", "tiny-llama", "--new-tokens", "0"], "--new-tokens"),
    (["bench", "tiny-llama", "--new-tokens", "500"], "max_seq_len"),
    (["bench", "tiny-llama", "--mode", "fast"], "has no modes"),
    (["bench", "tiny-llama", "--device", "cuda:x"], "unknown device"),
    (["bench", "tiny-llama", "--extra", "foo=1"], "takes no extra options"),
    (["bench", "tiny-llama", "-b", "ort", "--extra", "graph_optimization=x"], "graph_optim"),
    # coldstart
    (["coldstart", "tiny-llama", "-b", "eager", "--runs", "0"], "--runs"),
    (["coldstart", "tiny-llama", "-b", "eager", "--iters", "0"], "--iters"),
    (["coldstart", "tiny-llama", "-b", "inductor", "--mode", "fast"], "unknown inductor mode"),
    (["coldstart", "tiny-llama", "-b", "eager", "--device", "gpu"], "unknown device"),
    (["coldstart", "tiny-llama", "-b", "eager", "--extra", "foo=1"], "takes no extra options"),
    (["coldstart", "tiny-llama", "-b", "ort", "--extra", "bogus=1"], "does not take"),
    # compare
    ([*COMPARE, "--iters", "0"], "--iters"),
    ([*COMPARE, "--runs", "0"], "--runs"),
    ([*COMPARE, "--modes", "inductor=fast"], "unknown inductor mode"),
    ([*COMPARE, "--device", "cuda:x"], "unknown device"),
    ([*COMPARE, "--extra", "opset=18"], "expected BACKEND:KEY=VALUE"),
    ([*COMPARE, "--extra", "nope:opset=18"], "unknown backend"),
    ([*COMPARE, "--extra", "eager:opset=18"], "takes no extra options"),
    # remote
    (["prewarm", "tiny-llama", "-b", "eager"], "no remote configured"),
    (["prewarm", "tiny-llama", "-b", "eager", "--extra", "foo=1", *S3], "no extra options"),
    (["prewarm", "tiny-llama", "-b", "eager", "--weights", "/nonexistent", *S3], "not found"),
    (["push", "zzzz", *S3], "not a key prefix"),
    (["pull", "KEY", "zzzz", *S3], "not a key prefix"),
    # --max-seq-len: the recipe's own rules, before anything is built or spawned
    (["build", "tiny-llama", "--max-seq-len", "300"], "max_position_embeddings (256)"),
    (["build", "tiny-llama", "--max-seq-len", "0"], "max_seq_len must be positive"),
    ([*RUN, "--tokens", "1", "--max-seq-len", "257"], "max_position_embeddings"),
    ([*RUN, "--tokens", TOO_LONG, "--max-seq-len", "32"], "exceeds max_seq_len 32"),
    (["key", "tiny-llama", "-b", "eager", "--max-seq-len", "-1"], "must be positive"),
    (["bench", "tiny-llama", "--max-seq-len", "512"], "max_position_embeddings"),
    (["bench", "tiny-llama", "--max-seq-len", "8", "--new-tokens", "5"], "max_seq_len 8"),
    (["coldstart", "tiny-llama", "-b", "eager", "--max-seq-len", "0"], "must be positive"),
    ([*COMPARE, "--max-seq-len", "1000"], "max_position_embeddings"),
    (["prewarm", "tiny-llama", "-b", "eager", "--max-seq-len", "999", *S3], "max_position"),
    # --max-batch: the same rule as a recipe's [shapes].max_batch, checked before anything
    (["build", "tiny-llama", "--max-batch", "0"], "max_batch must be positive"),
    (["build", "tiny-llama", "--tag", ""], "--tag is empty"),
    (["key", "tiny-llama", "-b", "eager", "--tag", " "], "--tag is empty"),
    ([*RUN, "--tokens", "1", "--max-batch", "-3"], "max_batch must be positive"),
    (["key", "tiny-llama", "-b", "eager", "--max-batch", "0"], "must be positive"),
    (["bench", "tiny-llama", "--max-batch", "0"], "must be positive"),
    (["coldstart", "tiny-llama", "-b", "eager", "--max-batch", "0"], "must be positive"),
    ([*COMPARE, "--max-batch", "0"], "must be positive"),
    (["prewarm", "tiny-llama", "-b", "eager", "--max-batch", "0", *S3], "must be positive"),
    (["build", "examples/vision.py:net", "--max-batch", "2"], "--max-batch is for a recipe"),
    (["run", "examples/vision.py:net", "--max-batch", "2"], "--max-batch is for a recipe"),
    # cache
    (["gc"], "--max-size and/or --older-than"),
    (["gc", "--max-size", "10X"], "not a size"),
    (["gc", "--max-size", "-5"], "not a size"),
    (["gc", "--older-than", "7y"], "not a duration"),
    (["rm", "KEY", "zzzz"], "not a key prefix"),
    (["show", "zzzz"], "not a key prefix"),
    (["verify", "KEY", "zzzz"], "not a key prefix"),
    (["diff", "KEY", "zz"], "not a key prefix"),
    (["export", "KEY", "zzzz", "-o", "OUT"], "not a key prefix"),
    (["export", "KEY", "-o", "/nonexistent/dir/x.tar"], "does not exist"),
    (["export", "KEY", "-o", "TMPDIR"], "is a directory"),
    (["import", "/nonexistent/bundle.tar"], "does not exist"),
    # usage errors (click's): one line and exit 1 too, with where to look
    (["key", "tiny-llama"], "Missing option '--backend'"),
    ([*RUN, "--new-tokens", "abc"], "Invalid value for '--new-tokens'"),
    ([*RUN, "--bogus"], "No such option: --bogus (see `acache run --help`)"),
    (["bogus"], "No such command 'bogus'"),
    (["--bogus"], "No such option: --bogus"),
    (["build"], "Missing argument 'RECIPE'"),
    # numbers past what torch or a size can hold: bounded when parsed, not a traceback later
    (["build", "tiny-llama", "--seed", "99999999999999999999999"], "--seed must be"),
    (["key", "tiny-llama", "-b", "eager", "--seed", "-1"], "--seed must be"),
    ([*RUN, "--tokens", "1", "--sample-seed", "99999999999999999999999"], "--sample-seed"),
    (["gc", "--max-size", "99999999999999999999999T"], "--max-size"),
    (["gc", "--max-size", "9" * 400], "--max-size"),
]


def _invoke(args: list[str], key: str, tmp_path: Path, recipe: Path):
    subst = {"KEY": key, OUT: str(tmp_path / "out"), "TMPDIR": str(tmp_path), "BATCH0": recipe}
    return runner.invoke(app, [str(subst.get(a, a)) for a in args])


def _assert_one_line_error(result, needle: str) -> None:
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(("args", "needle"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_argument_leaves_the_cache_as_it_was(
    args, needle, populated, batch0_recipe, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root, key = populated
    monkeypatch.setenv("ACACHE_DIR", str(root))
    before = snapshot(root)
    _assert_one_line_error(_invoke(args, key, tmp_path, batch0_recipe), needle)
    assert snapshot(root) == before
    assert not (tmp_path / "out").exists()

    absent = tmp_path / "never-created"
    monkeypatch.setenv("ACACHE_DIR", str(absent))
    _assert_one_line_error(_invoke(args, key, tmp_path, batch0_recipe), needle)
    assert not absent.exists()


SPECIAL = [
    # special files where a file is read: refused before the first open
    (["build", "FIFO.toml", "-b", "eager"], {}, "not a regular file"),
    (["build", "HFDIR", "-b", "eager"], {}, "not a regular file"),
    (["key", "tiny-llama", "-b", "eager", "--weights", "FIFO.safetensors"], {}, "regular file"),
    (["push", "KEY", *S3, "--trusted-keys", "FIFO"], {}, "not a regular file"),
    (["push", "KEY", *S3, "--trusted-keys", "HUGE"], {}, "bytes"),
    # environment values: one parser, which names the variable and what it accepts
    (["ls"], {"ACACHE_ALLOW_SHARED_ROOT": "maybe"}, "ACACHE_ALLOW_SHARED_ROOT='maybe'"),
    (["push", "KEY", *S3], {"ACACHE_REMOTE_READ_ONLY": "maybe"}, "ACACHE_REMOTE_READ_ONLY"),
    (["push", "KEY", *S3], {"ACACHE_REMOTE_TRUST_UNSIGNED": "2"}, "ACACHE_REMOTE_TRUST_UNS"),
    (["verify"], {"ACACHE_VERIFY": "fulll"}, "ACACHE_VERIFY"),
]


@pytest.mark.parametrize(("args", "env", "needle"), SPECIAL, ids=[str(c) for c in SPECIAL])
def test_special_files_and_env_values_are_one_line_errors_at_once(
    args, env, needle, populated, tmp_path, monkeypatch
):
    import threading

    root, key = populated
    monkeypatch.setenv("ACACHE_DIR", str(root))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "hf").mkdir()
    os.mkfifo(tmp_path / "hf" / "config.json")
    (tmp_path / "model.safetensors").symlink_to(fifo)
    with open(tmp_path / "huge", "wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte that takes no disk
    subst = {"KEY": key, "FIFO.toml": str(tmp_path / "x.toml"), "HFDIR": str(tmp_path / "hf"),
             "FIFO.safetensors": str(tmp_path / "model.safetensors"), "FIFO": str(fifo),
             "HUGE": str(tmp_path / "huge")}  # fmt: skip
    os.mkfifo(tmp_path / "x.toml")
    before = snapshot(root)
    out: list = []
    worker = threading.Thread(
        target=lambda: out.append(runner.invoke(app, [subst.get(a, a) for a in args])),
        daemon=True,
    )
    worker.start()
    # A hang, not a speed, is what this catches: no timed threshold (the suite shares
    # the machine with compiles).
    worker.join(60)
    if worker.is_alive():  # a reader blocked on the special file: let the reader go, then fail
        for f in (fifo, tmp_path / "x.toml", tmp_path / "hf" / "config.json"):
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        worker.join(10)
        pytest.fail(f"{args} hung on a special file")
    _assert_one_line_error(out[0], needle)
    assert snapshot(root) == before


def test_a_recipe_may_ask_for_batch_rows(tmp_path):
    from artifactcache.recipes import load_recipe

    rec = load_recipe(_with_max_batch(tmp_path, 8))
    assert rec.shapes.max_batch == 8
    assert rec.with_shapes(max_batch=2).shapes.max_batch == 2
    assert rec.with_shapes(max_batch=8) is rec  # nothing to change


def test_library_checks_a_generation_request_before_anything_is_built():
    from artifactcache import api
    from artifactcache.errors import ShapeError
    from artifactcache.recipes import load_recipe

    rec = load_recipe("tiny-llama")
    api.check_generation(rec, [1, 2], 3)
    for ids, n, needle in [
        ([1, 2], 0, "at least 1"),
        ([1, rec.model.vocab_size], 1, "vocabulary"),
        ([], 1, "empty"),
        ([1] * rec.shapes.max_seq_len, 1, "max_seq_len"),
        ([1], rec.shapes.max_seq_len, "max_seq_len"),
    ]:
        with pytest.raises(ShapeError, match=needle):
            api.check_generation(rec, ids, n)


# ------------------------------------------------------------------ help text --


def _help(argv: list[str]) -> str:
    """``argv --help``, panel borders and line wrapping removed."""
    r = runner.invoke(app, [*argv, "--help"], env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    return " ".join(r.stdout.replace("│", " ").split())


def test_bracketed_words_in_help_are_shown_not_taken_for_markup():
    assert "Save it, edit [shapes] or [bench], and pass the file" in _help(["recipe"])
    for command in ("build", "run", "key", "bench", "coldstart", "compare", "prewarm"):
        out = _help([command])
        assert "the recipe's [shapes].max_seq_len" in out, command
        assert "the recipe's [shapes].max_batch" in out, command


def test_every_help_text_shows_every_bracketed_span_it_was_written_with():
    import re

    import typer

    def walk(command, argv):
        yield argv, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*argv, name])

    spans = 0
    for argv, command in walk(typer.main.get_command(app), []):
        out = _help(argv)
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for text in texts:
            written = text.replace("\\[", "[")  # as the source wrote it
            for span in re.findall(r"\[[^\[\]]*\]\S*", written):
                spans += 1
                assert " ".join(span.split()) in out, (argv, span)
    assert spans >= 15  # [shapes] in --max-seq-len/--max-batch of seven commands, and more


def test_help_shows_plain_value_names_and_nothing_after_a_flag():
    r = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "160"})
    assert r.exit_code == 0
    lines = {ln.split()[1]: ln for ln in r.stdout.splitlines() if ln.startswith("│ --")}
    assert "INTEGER" in lines["--new-tokens"] and "PATH" in lines["--cache-dir"]
    assert "<bool>" not in lines["--no-eos"] and "<bool>" not in lines["--json"]
    assert "--max-new-tokens" not in r.stdout  # the old spelling works, hidden
    assert "RECIPE" in r.stdout and "{recipe}" not in r.stdout


def test_third_party_warnings_are_hidden_here_and_in_children_unless_verbose(monkeypatch):
    import subprocess
    import sys
    import warnings

    from artifactcache.cli.app import quiet_third_party_warnings

    monkeypatch.delenv("ACACHE_VERBOSE", raising=False)
    monkeypatch.setenv("PYTHONWARNINGS", "error::UserWarning")
    child = [sys.executable, "-c", "import warnings; warnings.warn('old', FutureWarning)"]
    with warnings.catch_warnings():
        quiet_third_party_warnings()
        quiet_third_party_warnings()  # twice: no filter repeated
        env = os.environ["PYTHONWARNINGS"]
        assert env == "ignore::FutureWarning,ignore::DeprecationWarning,error::UserWarning"
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn("old", FutureWarning, stacklevel=1)
        assert not seen
    assert subprocess.run(child, capture_output=True, text=True).stderr == ""
    monkeypatch.setenv("PYTHONWARNINGS", "")
    quiet_third_party_warnings(verbose=True)  # acache --verbose
    assert os.environ["PYTHONWARNINGS"] == ""
    monkeypatch.setenv("ACACHE_VERBOSE", "maybe")  # a bad value fails no command: quiet
    quiet_third_party_warnings()
    assert os.environ["PYTHONWARNINGS"] == "ignore::FutureWarning,ignore::DeprecationWarning"
    monkeypatch.setenv("PYTHONWARNINGS", "")
    monkeypatch.setenv("ACACHE_VERBOSE", "1")
    quiet_third_party_warnings()
    assert os.environ["PYTHONWARNINGS"] == ""
    assert "FutureWarning: old" in subprocess.run(child, capture_output=True, text=True).stderr


def _misfit_checkpoints(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """(recipe, {misfit: checkpoint}): the recipe's own tensors, one of them re-shaped,
    dropped, or joined by a stranger."""
    from _generate_util import make_checkpoint
    from safetensors.torch import load_file, save_file

    recipe, good = make_checkpoint(tmp_path, tokenizer=False)
    state = load_file(str(good / "model.safetensors"))
    variants = {
        "has shape": {**state, "model.norm.weight": state["model.norm.weight"][:-1].clone()},
        "is missing": {k: v for k, v in state.items() if k != "model.norm.weight"},
        "unexpected tensor": {**state, "model.stranger": state["model.norm.weight"].clone()},
    }
    folders = {}
    for needle, tensors in variants.items():
        folder = tmp_path / needle.replace(" ", "-")
        folder.mkdir()
        save_file(tensors, str(folder / "model.safetensors"))
        folders[needle] = folder
    return recipe, folders


@pytest.mark.parametrize("command", ["build", "run", "key"])
def test_a_checkpoint_that_does_not_fit_is_refused_before_the_cache_is_opened(
    command, populated, tmp_path, monkeypatch
):
    recipe, folders = _misfit_checkpoints(tmp_path)
    extra = {"build": [], "run": ["--tokens", "1,2"], "key": []}[command]
    root, _ = populated
    for needle, folder in folders.items():
        args = [command, str(recipe), "-b", "eager", "--weights", str(folder), *extra]
        monkeypatch.setenv("ACACHE_DIR", str(root))
        before = snapshot(root)
        _assert_one_line_error(runner.invoke(app, args), needle)
        assert snapshot(root) == before  # no lock, no digest memo, no miss counted
        absent = tmp_path / "never-created"
        monkeypatch.setenv("ACACHE_DIR", str(absent))
        _assert_one_line_error(runner.invoke(app, args), needle)
        assert not absent.exists()


def test_a_model_spec_refuses_what_only_generation_takes(tmp_path, monkeypatch):
    monkeypatch.setenv("ACACHE_DIR", str(tmp_path / "never-created"))
    spec = "examples/vision.py:net"
    given = [["--new-tokens", "-5"], ["--prompt", "hi"], ["--tokens", "1,2"],
             ["--temperature", "0.7"], ["--top-k", "5"], ["--top-p", "0.9"],
             ["--sample-seed", "3"], ["--eos-id", "3"], ["--no-eos"]]  # fmt: skip
    for args in given:
        result = runner.invoke(app, ["run", spec, "-b", "eager", *args])
        _assert_one_line_error(result, f"{args[0]} is for generating from a recipe")
    assert not (tmp_path / "never-created").exists()


def test_an_unavailable_default_backend_says_it_was_the_default(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("aoti is available on this machine's GPU")
    monkeypatch.setenv("ACACHE_DIR", str(tmp_path / "never-created"))
    defaulted = runner.invoke(app, ["run", "tiny-llama", "--device", "cuda", "--tokens", "1"])
    _assert_one_line_error(defaulted, "(the default backend on cuda: pick another with -b)")
    named = runner.invoke(app, ["run", "tiny-llama", "-b", "aoti", "--device", "cuda"])
    _assert_one_line_error(named, "backend 'aoti' is unavailable")
    assert "default" not in named.stderr
    assert not (tmp_path / "never-created").exists()


@pytest.mark.parametrize("command", ["build", "run"])
def test_a_model_spec_whose_factory_raises_leaves_the_cache_as_it_was(
    command, populated, tmp_path, monkeypatch
):
    (tmp_path / "badmod.py").write_text("def factory():\n    raise RuntimeError('no weights')\n")
    monkeypatch.chdir(tmp_path)
    root, _ = populated
    for cache in (root, tmp_path / "never-created"):
        monkeypatch.setenv("ACACHE_DIR", str(cache))
        before = snapshot(cache)
        result = runner.invoke(app, [command, "badmod.py:factory", "-b", "eager"])
        _assert_one_line_error(result, "the factory raised RuntimeError: no weights")
        assert snapshot(cache) == before
    assert not (tmp_path / "never-created").exists()


@pytest.mark.parametrize("args", [[], ["remote"]], ids=["acache", "acache remote"])
def test_a_group_without_a_command_shows_its_help_not_an_error(args):
    result = runner.invoke(app, args)
    assert "Usage: acache" in result.stdout + result.stderr
    assert "error:" not in result.stdout + result.stderr


def test_version_prints_the_packages_version_and_the_package_lists_its_lazy_names():
    import artifactcache

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"acache {artifactcache.__version__}\n"
    assert {"load", "build", "compile", "LocalStore"} <= set(dir(artifactcache))
