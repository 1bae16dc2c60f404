"""The cache commands through the real Typer app: output, exit codes, one-line errors."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.store.keyformat import compute_key
from artifactcache.store.local import LocalStore

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_user_error(result, *, contains: str = "") -> None:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert contains in lines[0]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def put(store: LocalStore, i: int, *, recipe: str = "tiny", key: str | None = None) -> str:
    factors = {"schema": 1, "backend": {"name": "eager", "options": {"dtype": f"fp{i}"}}}
    key = key or compute_key(factors)

    def build(d: Path) -> dict:
        (d / "model.bin").write_bytes(bytes([i]) * 2000)
        return {}

    store.get_or_build(key, factors, build, label={"recipe": recipe, "backend": "eager"})
    return key


@pytest.fixture
def store(cache_dir) -> LocalStore:
    return LocalStore(cache_dir)


def test_ls_show_stats_diff_rm(store):
    k1, k2 = put(store, 1), put(store, 2)
    r = run("ls", "--json")
    assert r.exit_code == 0 and {e["key"] for e in json.loads(r.stdout)} == {k1, k2}
    r = runner.invoke(app, ["ls"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and k1[:12] in r.stdout and "2 entries" in r.stdout
    r = run("show", k1[:8], "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["manifest"]["key"] == k1
    shown = runner.invoke(app, ["show", k1[:8]], env={"COLUMNS": "200"}).stdout
    assert k1 in shown
    # Read as people read them: when (and how long ago), a size with its unit, the
    # label as its choices; --json keeps the raw numbers and the dict.
    assert re.search(r"created +│ 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d \(\d+s ago\)", shown)
    assert "2.0 KiB (2000 bytes)" in shown and "backend=eager, recipe=tiny" in shown
    assert re.search(r"build_seconds +│ \d+\.\d s ", shown)
    assert re.search(r"depends_on +│ - ", shown)
    assert "{'" not in shown and isinstance(json.loads(r.stdout)["created"], float)
    r = run("diff", k1[:8], k2[:8], "--json")
    assert r.exit_code == 0
    assert [d["factor"] for d in json.loads(r.stdout)] == ["backend.options.dtype"]
    assert "backend.options.dtype" in run("diff", k1[:8], k2[:8]).stdout
    assert "identical" in run("diff", k1[:8], k1).stdout
    store.get(k1)
    s = json.loads(run("stats", "--json").stdout)
    assert (s["hits"], s["builds"], s["entries"]) == (1, 2, 2)
    human = run("stats").stdout
    assert "build time saved by hits" in human and "size on disk" in human
    assert not re.search(r"\d\.\d{4,}", human)  # no raw floats: units, a few digits
    r = run("rm", k1[:8])
    assert r.exit_code == 0 and "removed 1 entry, freed" in r.stdout
    assert [e.key for e in store.scan()[0]] == [k2]
    k3 = put(store, 3)
    r = run("rm", k2[:8], k3[:8], "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["removed"] == [k2, k3]
    assert json.loads(r.stdout)["freed"] > 2 * 2000  # both model.bin files, and more
    assert store.scan()[0] == []


def test_verify_reports_corruption(store):
    k1, k2 = put(store, 1), put(store, 2)
    assert run("verify").exit_code == 0
    path = store.entry_path(k1) / "model.bin"
    path.write_bytes(b"\x00" + path.read_bytes()[1:])
    r = run("verify", "--json")
    assert_user_error(r, contains="1 of 2 entries failed verification")
    assert {x["key"]: x["ok"] for x in json.loads(r.stdout)} == {k1: False, k2: True}
    assert [e.key for e in store.scan()[0]] == [k2]  # quarantined


def test_gc_dry_run_then_lru(store):
    keys = [put(store, i) for i in range(1, 4)]
    for age, key in zip((3, 2, 1), keys, strict=True):  # keys[0] least recently used
        t = time.time() - age * 3600
        os.utime(store.entry_path(key), (t, t))
    before = snapshot(store.base / "entries")
    r = run("gc", "--max-size", "5KiB", "--dry-run", "--json")
    assert r.exit_code == 0 and [e["key"] for e in json.loads(r.stdout)["entries"]] == keys[:1]
    assert snapshot(store.base / "entries") == before  # dry run deletes nothing
    r = run("gc", "--max-size", "3000", "--older-than", "90m")
    assert r.exit_code == 0 and "evicted 2 entries" in r.stdout
    assert [e.key for e in store.scan()[0]] == [keys[2]]
    assert_user_error(run("gc", "--max-size", "10Q"), contains="not a size")
    assert_user_error(run("gc"), contains="--max-size and/or --older-than")


def test_prune_cli(store):
    (store.base / "staging" / "leftover").mkdir()
    shown = run("prune", "--dry-run")
    assert shown.exit_code == 0 and shown.stdout.startswith("would prune 1 staging dirs")
    assert (store.base / "staging" / "leftover").exists()
    r = run("prune", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["staging"] == 1
    assert not (store.base / "staging" / "leftover").exists()


def test_export_import_cli(store, tmp_path):
    k1 = put(store, 1)
    out = tmp_path / "b.tar"
    r = run("export", k1[:8], "-o", out)
    assert r.exit_code == 0 and out.exists()
    other = tmp_path / "other"
    r = run("import", out, "--cache-dir", other, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == {"imported": [k1], "already_present": []}
    assert LocalStore(other).open(k1).key == k1
    # Entries already there are kept, and said to be, not counted as imported.
    k2 = put(store, 2)
    r = run("export", k1[:8], k2[:8], "-o", out, "--force", "--json")
    assert r.exit_code == 0, r.stderr
    exported = json.loads(r.stdout)
    assert sorted(exported.pop("exported")) == sorted([k1, k2])
    assert exported == {"path": str(out), "bytes": out.stat().st_size}
    r = run("import", out, "--cache-dir", other)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == f"imported 1 entry: {k2[:12]}; 1 already present: {k1[:12]}"
    r = run("import", out, "--cache-dir", other, "--json")
    assert json.loads(r.stdout) == {"imported": [], "already_present": [k1, k2]}
    r = run("import", out, "--cache-dir", other)
    assert r.stdout.strip() == f"imported 0 entries; 2 already present: {k1[:12]}, {k2[:12]}"


def test_export_of_an_entry_pulled_with_flags_needs_no_flag(store, tmp_path, monkeypatch):
    """Pulled with --remote-trust-unsigned: export (which has no such flag, and loads
    nothing) copies it; the importer applies its own trust."""
    monkeypatch.delenv("ACACHE_REMOTE_TRUST_UNSIGNED", raising=False)
    other = LocalStore(tmp_path / "fleet")
    key = put(other, 7)
    staging = tmp_path / "staging"
    shutil.copytree(other.entry_path(key), staging)
    manifest = other.open(key).manifest
    store.publish_dir(staging, manifest, provenance={"source": "pulled", "remote": "s3://b/x"})
    r = run("export", key[:8], "-o", tmp_path / "p.tar")
    assert r.exit_code == 0, r.stderr
    assert "--remote-trust-unsigned" not in r.stdout + r.stderr


def _bundle(path: Path, key: str, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    with tarfile.open(path, "w") as tf:
        good = tarfile.TarInfo(f"{key}/manifest.json")
        good.size = 2
        tf.addfile(good, io.BytesIO(b"{}"))
        member.size = len(data)
        tf.addfile(member, io.BytesIO(data))
    return path


def _manifest_only(path: Path, key: str, data: bytes) -> Path:
    with tarfile.open(path, "w") as tf:
        member = tarfile.TarInfo(f"{key}/manifest.json")
        member.size = len(data)
        tf.addfile(member, io.BytesIO(data))
    return path


def _symlink_member(key: str) -> tarfile.TarInfo:
    m = tarfile.TarInfo(f"{key}/model.bin")
    m.type, m.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return m


BAD_INPUTS = {
    "unknown-recipe": (lambda k, t: ["key", "nope", "--backend", "eager"], "unknown recipe"),
    "unknown-backend": (lambda k, t: ["key", "tiny-llama", "--backend", "nope"], "unknown backend"),
    "unknown-prefix": (lambda k, t: ["show", "12345678"], "no entry matches"),
    "ambiguous-prefix": (lambda k, t: ["show", "abcdef01"], "ambiguous"),
    "short-prefix": (lambda k, t: ["rm", "abc"], "8 to 64"),
    "export-unknown": (lambda k, t: ["export", "12345678", "-o", t / "x.tar"], "no entry"),
    "malformed-bundle": (lambda k, t: ["import", t / "junk.tar"], "not a readable tar"),
    "dotdot-bundle": (
        lambda k, t: ["import", _bundle(t / "dd.tar", k, tarfile.TarInfo(f"{k}/../../x"), b"x")],
        "unsafe path",
    ),
    "manifest-not-json": (
        lambda k, t: ["import", _manifest_only(t / "nj.tar", k, b"{not json")],
        "is not valid JSON",
    ),
    "symlink-bundle": (
        lambda k, t: ["import", _bundle(t / "sl.tar", k, _symlink_member(k))],
        "is a link",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_one_line_nothing_written(store, tmp_path, case):
    put(store, 1, key="abcdef01" + "0" * 56)
    put(store, 2, key="abcdef01" + "1" * 56)
    (tmp_path / "junk.tar").write_bytes(b"not a tar" * 200)
    make_args, contains = BAD_INPUTS[case]
    args = make_args("ab" * 32, tmp_path)
    before = snapshot(store.root)
    assert_user_error(run(*args), contains=contains)
    assert snapshot(store.root) == before
    assert not (tmp_path / "x.tar").exists()


def test_bad_cache_roots(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert_user_error(run("ls", "--cache-dir", afile), contains="not a directory")
    assert_user_error(run("ls", "--cache-dir", afile / "sub"), contains="cannot create")
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    assert_user_error(run("ls", "--cache-dir", tmp_path / "link"), contains="symlink")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert_user_error(run("stats", "--cache-dir", shared), contains="--allow-shared-root")
    assert os.listdir(real) == [] and os.listdir(shared) == []  # nothing written
    assert run("ls", "--cache-dir", shared, "--allow-shared-root").exit_code == 0
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert_user_error(run("ls", "--cache-dir", ro), contains="not readable and writable")


def test_key_explain():
    pytest.importorskip("torch")
    r = run("key", "tiny-llama", "--backend", "eager", "--json")
    if r.exit_code == 1 and "unavailable" in r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["key"] == compute_key(info["factors"])
    r = run("key", "tiny-llama", "--backend", "eager", "--explain")
    assert r.exit_code == 0 and r.stdout.split()[0] == info["key"]
    assert "backend.name" in r.stdout and "toolchain.python" in r.stdout


def test_module_entry_point_one_line_error(cache_dir):
    r = subprocess.run(
        [sys.executable, "-m", "artifactcache.cli", "show", "12345678"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr.startswith("error: no entry matches")
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


# ------------------------------------------------ stray items in the tree --

STRAY = {
    "prefix-is-a-file": lambda v1, k: (v1 / "entries" / "ee").write_text("x"),
    "prefix-is-a-symlink": lambda v1, k: (v1 / "entries" / "ef").symlink_to(v1 / "state"),
    "file-in-prefix": lambda v1, k: (v1 / "entries" / k[:2] / "junk").write_text("x"),
    "entry-is-a-file": lambda v1, k: (
        (v1 / "entries" / "aa").mkdir() or (v1 / "entries" / "aa" / ("aa" * 32)).write_text("x")
    ),
    "manifest-is-a-dir": lambda v1, k: (v1 / "entries" / "bb" / ("bb" * 32) / MANIFEST).mkdir(
        parents=True
    ),
    "entry-under-wrong-prefix": lambda v1, k: (v1 / "entries" / "cc" / ("dd" * 32)).mkdir(
        parents=True
    ),
    "dir-in-locks": lambda v1, k: (v1 / "locks" / "junk.lock").mkdir(),
    "symlink-in-locks": lambda v1, k: (v1 / "locks" / "x.lock").symlink_to("/etc/passwd"),
    "file-in-staging": lambda v1, k: (v1 / "staging" / "junk").write_text("x"),
    "file-in-quarantine": lambda v1, k: (v1 / "quarantine" / "junk").write_text("x"),
    "index-is-a-dir": lambda v1, k: (v1 / "state" / "index.json").mkdir(),
    "memo-is-a-dir": lambda v1, k: (
        (v1 / "state" / f"{k}.verified").unlink() or (v1 / "state" / f"{k}.verified").mkdir()
    ),
}
MANIFEST = "manifest.json"
STRAY_COMMANDS = [["ls"], ["ls", "--json"], ["stats"], ["verify"], ["gc", "--max-size", "1G"]]
STRAY_COMMANDS += [["prune"], ["doctor"], ["doctor", "--json"]]


@pytest.mark.parametrize("stray", sorted(STRAY))
def test_stray_items_anywhere_never_crash(store, stray):
    key = put(store, 1)
    STRAY[stray](store.base, key)
    if stray.startswith(("prefix-", "file-in-prefix", "entry-", "manifest-", "file-in-")):
        assert "warning: " in run("ls").stderr  # before verify quarantines or prune removes it
    for args in STRAY_COMMANDS:
        r = run(*args)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
        assert "Traceback" not in r.stdout + r.stderr, args
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
        others = [ln for ln in r.stderr.splitlines() if ln and not ln.startswith("error: ")]
        assert all(ln.startswith("warning: ") for ln in others), (args, r.stderr)
        # verify may quarantine a damaged entry (one line, exit 1); nothing else fails
        assert r.exit_code == 0 or (args == ["verify"] and len(errors) == 1), (args, r.stderr)
    assert key in {e.key for e in store.scan()[0]}  # the good entry survived all of it


# ------------------------------------------- OS-level failures: one line --


def test_verify_os_error_is_an_error_not_corruption(store, monkeypatch):
    from artifactcache.store import _fs

    k1 = put(store, 1)

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(_fs, "digest_file", denied)
    r = run("verify", "--json")
    assert_user_error(r, contains="could not be verified and were left in place")
    assert json.loads(r.stdout)[0]["quarantined"] is False
    monkeypatch.undo()
    assert [e.key for e in store.scan()[0]] == [k1] and run("verify").exit_code == 0


def test_rm_of_an_entry_in_use_or_needed_is_one_line(store, cache_dir):
    k1, k2 = put(store, 1), put(store, 2)
    with store.reading(k1):
        assert_user_error(run("rm", k1[:8]), contains="being loaded by another process")
        r = run("gc", "--max-size", "0", "--json")
        assert r.exit_code == 0 and json.loads(r.stdout)["in_use"] == [k1]
        assert "skipped" in r.stderr
    assert store.open(k1)

    def dependent(d: Path) -> dict:
        store.record_dependency(k1)
        (d / "x.bin").write_bytes(b"x")
        return {}

    k3 = store.get_or_build("3" * 64, {"n": 3}, dependent)[0].key
    assert_user_error(run("rm", k1[:8]), contains=f"needed by entry {k3[:12]}")
    r = run("rm", k1[:8], k3[:8])
    assert r.exit_code == 0 and "removed 2" in r.stdout
    assert k2 not in {e.key for e in store.scan()[0]}  # gc took it while k1 was in use


def test_export_to_an_unwritable_place_is_one_line(store, tmp_path, monkeypatch):
    k1 = put(store, 1)
    missing_dir = tmp_path / "no" / "x.tar"
    assert_user_error(run("export", k1[:8], "-o", missing_dir), contains="does not exist")
    import tarfile as tarmod

    def denied(name, *a, **k):
        raise PermissionError(13, "Permission denied", str(name))

    monkeypatch.setattr(tarmod, "open", denied)
    assert_user_error(run("export", k1[:8], "-o", tmp_path / "x.tar"), contains="Permission")
    assert list(tmp_path.glob("*x.tar*")) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")
def test_export_into_a_read_only_dir_is_one_line(store, tmp_path):
    k1 = put(store, 1)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    assert_user_error(run("export", k1[:8], "-o", ro / "x.tar"), contains="Permission denied")


def test_import_into_an_unwritable_cache_is_one_line(store, tmp_path, monkeypatch):
    k1 = put(store, 1)
    run("export", k1[:8], "-o", tmp_path / "b.tar")
    other = LocalStore(tmp_path / "other")

    real_mkdir = os.mkdir

    def read_only(path, *a, **k):  # the root's dirs exist (EEXIST); a new staging dir fails
        if Path(path).parent == other.base / "staging":
            raise OSError(30, "Read-only file system", str(path))
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", read_only)
    r = run("import", tmp_path / "b.tar", "--cache-dir", other.root)
    assert_user_error(r, contains="Read-only file system")
    assert "damaged" not in r.stderr
    assert os.listdir(other.base / "entries") == []


def test_build_on_a_full_disk_end_to_end(cache_dir):
    """A real child process whose writes fail once a file passes 64 bytes (EFBIG)."""
    pytest.importorskip("torch")
    import resource
    import signal

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    r = subprocess.run(
        [sys.executable, "-m", "artifactcache.cli", "build", "tiny-llama", "--backend", "eager"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_file_size,
    )
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: building"), r.stderr
    assert "File too large" in lines[0] and "nothing was cached" in lines[0]
    v1 = cache_dir / "v1"
    assert os.listdir(v1 / "entries") == [] and os.listdir(v1 / "staging") == []
    assert run("build", "tiny-llama", "--backend", "eager").exit_code == 0  # space back: builds


@pytest.mark.parametrize("name", ["llama [/v2]", "red\x1b[31mname\x07"])
def test_names_are_printed_as_data_not_markup(store, name):
    # A label is the user's text: rich must neither parse it nor pass escapes to the terminal.
    key = put(store, 1, recipe=name)
    shown = name.replace("\x1b", "\\x1b").replace("\x07", "\\x07")
    for args in (["ls"], ["gc", "--max-size", "0", "--dry-run"], ["show", key[:12]]):
        r = runner.invoke(app, args, env={"COLUMNS": "300"})
        assert r.exit_code == 0, (args, r.stdout, r.stderr)
        assert shown in r.stdout, (args, r.stdout)
        assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout, args


def test_the_error_line_shows_control_characters_visibly(tmp_path):
    r = run("import", str(tmp_path / "no\x1b[31mne.tar"))
    assert_user_error(r, contains="no\\x1b[31mne.tar")
    assert "\x1b" not in r.stderr


def _outside_file(tmp_path: Path) -> Path:
    target = tmp_path / "precious.txt"
    target.write_bytes(b"keep me")
    return target


def _old_bundle(tmp_path: Path) -> Path:
    (tmp_path / "old.tar").write_bytes(b"an older bundle")
    return tmp_path / "old.tar"


def _symlink_to_outside(tmp_path: Path, store: LocalStore, key: str) -> Path:
    (tmp_path / "link.tar").symlink_to(_outside_file(tmp_path))
    return tmp_path / "link.tar"


def _symlink_to_dir(tmp_path: Path, store: LocalStore, key: str) -> Path:
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "keep.txt").write_bytes(b"keep me")
    (tmp_path / "dirlink.tar").symlink_to(tmp_path / "precious", target_is_directory=True)
    return tmp_path / "dirlink.tar"


def _directory(tmp_path: Path, store: LocalStore, key: str) -> Path:
    (tmp_path / "adir.tar").mkdir()
    return tmp_path / "adir.tar"


def _fifo(tmp_path: Path, store: LocalStore, key: str) -> Path:
    os.mkfifo(tmp_path / "pipe.tar")
    return tmp_path / "pipe.tar"


EXPORT_TARGETS = {
    # kind: (make the path, replaced with --force?)
    "file": (lambda t, s, k: _old_bundle(t), True),
    "symlink": (_symlink_to_outside, False),  # a link is never written through nor replaced
    "symlink-to-dir": (_symlink_to_dir, False),
    "directory": (_directory, False),
    "fifo": (_fifo, False),
    "file-in-an-entry": (lambda t, s, k: s.open(k).path / "model.bin", False),
    "new-file-in-the-cache": (lambda t, s, k: s.base / "x.tar", False),
}


@pytest.mark.parametrize("kind", sorted(EXPORT_TARGETS))
def test_export_never_replaces_what_is_at_the_output_path(store, tmp_path, kind):
    k1 = put(store, 1)
    make, replaceable = EXPORT_TARGETS[kind]
    out = make(tmp_path, store, k1)
    before_tmp, before_cache = snapshot(tmp_path), snapshot(store.root)
    assert_user_error(run("export", k1[:8], "-o", out))
    assert snapshot(tmp_path) == before_tmp and snapshot(store.root) == before_cache
    r = run("export", k1[:8], "-o", out, "--force")
    if not replaceable:
        assert_user_error(r)
        assert snapshot(tmp_path) == before_tmp and snapshot(store.root) == before_cache
        LocalStore(store.root, full_verify=True).open(k1)
        return
    assert r.exit_code == 0, r.stderr
    assert not out.is_symlink() and tarfile.is_tarfile(out)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_export_to_a_symlink_to_a_directory_is_one_line_and_writes_nothing(store, tmp_path, force):
    """The CLI and the store once disagreed here (is_dir() follows the link, lstat does
    not); now one check refuses any symlink before the store is even opened."""
    k1 = put(store, 1)
    out = _symlink_to_dir(tmp_path, store, k1)
    before_tmp, before_cache = snapshot(tmp_path), snapshot(store.root)
    r = run("export", k1[:8], "-o", out, *(["--force"] if force else []))
    assert_user_error(r, contains="is a symlink to a directory, not a file")
    assert out.is_symlink() and os.listdir(tmp_path / "precious") == ["keep.txt"]
    assert snapshot(tmp_path) == before_tmp and snapshot(store.root) == before_cache


def test_a_malformed_manifest_never_crashes_a_command(store, tmp_path):
    bad, good = put(store, 1), put(store, 2)
    path = store.entry_path(bad) / "manifest.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), created="yesterday")))
    os.utime(store.entry_path(bad))
    for args in (["ls"], ["ls", "--json"], ["stats"], ["gc", "--max-size", "0", "--dry-run"]):
        r = run(*args)
        assert r.exit_code == 0 and "Traceback" not in r.stdout + r.stderr, (args, r.stderr)
        assert f"warning: entry {bad[:12]}" in r.stderr, args
    assert_user_error(run("export", bad[:12], "-o", tmp_path / "b.tar"), contains="created")
    assert not (tmp_path / "b.tar").exists()
    r = run("rm", good[:12])
    assert r.exit_code == 0 and "removed 1" in r.stdout


def test_show_and_ls_json_name_where_an_entry_came_from(store):
    key = put(store, 3)
    (row,) = json.loads(run("ls", "--json").stdout)
    assert row["provenance"] == {"source": "built"}
    assert json.loads(run("show", key[:12], "--json").stdout)["provenance"] == {"source": "built"}
    assert "built here" in run("show", key[:12]).stdout


def test_ls_tells_apart_entries_of_one_recipe_by_their_build_choices(tmp_path: Path):
    """Two tiny-llama eager builds differing only in dtype and context: one row each,
    showing what differs (issue 33, item 8)."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    for args in (["--dtype", "fp32"], ["--dtype", "bf16", "--max-seq-len", "32"]):
        r = run("build", "tiny-llama", "-b", "eager", "--cache-dir", cache, *args)
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["ls", "--cache-dir", str(cache)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.stdout.splitlines() if "tiny-llama" in ln]
    assert len(rows) == 2
    assert any("fp32" in ln and " 64 " in ln for ln in rows), rows
    assert any("bf16" in ln and " 32 " in ln for ln in rows), rows
    assert "context" in r.stdout and "rows" in r.stdout


def test_a_piped_table_keeps_its_whole_width_when_no_width_is_asked(store, monkeypatch):
    """rich would fold a piped table at 80 columns; COLUMNS, when set, still rules."""
    k1 = put(store, 1)
    monkeypatch.delenv("COLUMNS", raising=False)
    r = runner.invoke(app, ["ls"])
    assert r.exit_code == 0 and k1[:12] in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) > 80


@pytest.mark.parametrize(
    ("entries", "shows", "not_shown"),
    [(True, "3/3 entries", "bytes"), (False, "3 bytes", "entries")],
)
def test_the_progress_bar_counts_what_the_command_counts(monkeypatch, entries, shows, not_shown):
    from rich.console import Console

    from artifactcache.cli import cache

    out = io.StringIO()
    term = Console(file=out, force_terminal=True, width=100, color_system=None)
    monkeypatch.setattr(cache, "err_console", term)
    with cache._progress("verifying", entries=entries) as cb:
        assert cb is not None
        cb(3, 3)
    assert shows in out.getvalue() and not_shown not in out.getvalue()


def test_looking_at_a_root_that_did_not_exist_says_so(tmp_path):
    typo = tmp_path / "cahce"
    r = run("ls", "--cache-dir", typo)
    assert r.exit_code == 0 and "0 entries" in r.stdout
    assert f"note: {typo} did not exist: an empty cache was made there" in r.stderr
    again = run("stats", "--cache-dir", typo)
    assert again.exit_code == 0 and again.stderr == ""  # there now: nothing to say
    for command in (["prune", "--dry-run"], ["verify"]):
        other = tmp_path / f"typo-{command[0]}"
        r = run(*command, "--cache-dir", other)
        assert r.exit_code == 0 and f"note: {other} did not exist" in r.stderr
