"""The remote tier when things go wrong, against a real SeaweedFS S3 server: the server
killed mid-push or down, and corrupted remote objects, manifests or local entries."""

from __future__ import annotations

import tracemalloc

import pytest
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.store import remote as remote_mod
from artifactcache.store import s3 as s3_mod
from artifactcache.store.local import LocalStore
from artifactcache.store.remote import tree_id
from artifactcache.store.s3 import S3Store
from artifactcache.store.tiered import open_tiered
from tests import _remote_util as util
from tests import s3_server as srv
from tests._remote_util import (
    assert_local_clean,
    factors_of,
    key_of,
    make_build,
    never_build,
    one_error_line,
    private_store,
    remote_manifest,
    tree_bytes,
)
from tests.s3_server import BUCKET, SeaweedServer, _free_ports

# The server fixtures live in tests/s3_server.py and the signing-key one in
# tests/_remote_util.py (not conftest): bind them here.
s3_server = srv.s3_server
s3_remote = srv.s3_remote
builder_key = util.builder_key

runner = CliRunner()


# ----------------------------------------------------------------- outages --


def _kill_after_first_file(server: SeaweedServer):
    seen: list[str] = []

    def hook(stage: str) -> None:
        seen.append(stage)
        if len(seen) == 1:
            server.stop(kill=True)

    return hook


def test_server_killed_mid_push_explicit_error_then_retry(
    s3_server, s3_remote, tmp_path, monkeypatch
):
    key = key_of("outage-explicit")
    entry, _ = LocalStore().get_or_build(key, factors_of("outage-explicit"), make_build(b"out"))
    monkeypatch.setattr(remote_mod, "PUSH_HOOK", _kill_after_first_file(s3_server))
    res = runner.invoke(app, ["push", key[:12], "--remote", s3_remote])
    assert res.exit_code == 1
    assert "cannot reach remote" in one_error_line(res)
    assert LocalStore(full_verify=True).open(key).files == entry.files  # local entry intact

    monkeypatch.setattr(remote_mod, "PUSH_HOOK", None)
    s3_server.start()
    assert remote_manifest(S3Store(s3_remote), key) is None  # readers never saw half a push
    res = runner.invoke(app, ["push", key[:12], "--remote", s3_remote])
    assert res.exit_code == 0, res.output
    assert "pushed" in res.stdout
    host_b = open_tiered(private_store(tmp_path / "b"), s3_remote)
    assert tree_bytes(host_b.open(key)) == tree_bytes(entry)


def test_server_killed_mid_implicit_push_only_warns(
    s3_server, s3_remote, tmp_path, monkeypatch, capsys
):
    key = key_of("outage-implicit")
    monkeypatch.setattr(remote_mod, "PUSH_HOOK", _kill_after_first_file(s3_server))
    host_a = open_tiered(private_store(tmp_path / "a"), s3_remote)
    entry, source = host_a.get_or_build(key, factors_of("outage-implicit"), make_build(b"imp"))
    assert source == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: push of ") and "acache push" in err[0]
    assert host_a.local.stats()["remote_errors"] == 1
    assert LocalStore(tmp_path / "a", full_verify=True).open(key).files == entry.files

    monkeypatch.setattr(remote_mod, "PUSH_HOOK", None)
    s3_server.start()
    assert host_a.push(key)["status"] == "pushed"
    host_b = open_tiered(private_store(tmp_path / "b"), s3_remote)
    assert host_b.get_or_build(key, factors_of("outage-implicit"), never_build)[1] == "pulled"


def test_remote_down_is_a_warning_and_a_miss(tmp_path, monkeypatch, capsys):
    (port,) = _free_ports(1)  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    store = open_tiered(private_store(tmp_path / "a"), f"s3://{BUCKET}/down")
    key = key_of("down")
    entry, source = store.get_or_build(key, factors_of("down"), make_build(b"down"))
    assert source == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("warning: ") for line in err)  # pull, push
    assert "cannot reach remote" in err[0]
    assert "skipped: remote" in err[1]  # no second timeout within one process
    assert store.local.stats()["remote_errors"] == 2
    assert store.get(key).files == entry.files  # and a later load is a local hit


# -------------------------------------------------------------- corruption --


def test_corrupted_remote_object_is_detected_and_never_published(
    s3_server, s3_remote, tmp_path, capsys
):
    key = key_of("corrupt")
    host_a = open_tiered(private_store(tmp_path / "a"), s3_remote)
    entry, _ = host_a.get_or_build(key, factors_of("corrupt"), make_build(b"good"))
    manifest = remote_manifest(host_a.remote, key)
    prefix = s3_remote.split("/", 3)[3]
    obj = f"{prefix}/v1/{key}/{tree_id(manifest)}/model.bin"
    client = s3_server.client()
    data = client.get_object(Bucket=BUCKET, Key=obj)["Body"].read()
    client.put_object(Bucket=BUCKET, Key=obj, Body=bytes([data[0] ^ 1]) + data[1:])

    b_dir = tmp_path / "b"
    res = runner.invoke(app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(b_dir)])
    assert res.exit_code == 1
    assert "failed verification" in one_error_line(res)
    assert_local_clean(LocalStore(b_dir))

    # In a build path the corrupt copy is a warning and a miss; the verified rebuild
    # replaces the remote copy, so a third host pulls a good one.
    capsys.readouterr()
    host_b = open_tiered(LocalStore(b_dir), s3_remote)
    assert host_b.get_or_build(key, factors_of("corrupt"), make_build(b"good"))[1] == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "failed verification" in err[0]
    host_c = open_tiered(private_store(tmp_path / "c"), s3_remote)
    assert tree_bytes(host_c.open(key)) == tree_bytes(entry)


def test_corrupted_remote_manifest_fails_pull_and_push_replaces_it(s3_server, s3_remote, tmp_path):
    key = key_of("bad-manifest")
    entry, _ = LocalStore().get_or_build(key, factors_of("bad-manifest"), make_build(b"m"))
    prefix = s3_remote.split("/", 3)[3]
    s3_server.client().put_object(Bucket=BUCKET, Key=f"{prefix}/v1/{key}/manifest.json", Body=b"{")
    res = runner.invoke(
        app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "b")]
    )
    assert res.exit_code == 1
    assert "not valid JSON" in one_error_line(res)
    assert_local_clean(LocalStore(tmp_path / "b"))
    res = runner.invoke(app, ["push", key, "--remote", s3_remote])
    assert res.exit_code == 0 and "pushed" in res.stdout, res.output
    res = runner.invoke(
        app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "b")]
    )
    assert res.exit_code == 0, res.output
    assert tree_bytes(LocalStore(tmp_path / "b").open(key)) == tree_bytes(entry)


def test_push_of_a_locally_damaged_entry_sends_nothing(s3_remote):
    key = key_of("damaged")
    entry, _ = LocalStore().get_or_build(key, factors_of("damaged"), make_build(b"dmg"))
    target = entry.path / "model.bin"
    target.chmod(0o600)
    data = target.read_bytes()
    target.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size: only the digest can tell
    res = runner.invoke(app, ["push", key, "--remote", s3_remote])
    assert res.exit_code == 1
    assert "no longer matches its manifest" in one_error_line(res)
    remote = S3Store(s3_remote)
    assert remote_manifest(remote, key) is None
    assert not [p for p in remote.list(f"v1/{key}") if p.endswith("model.bin")]


@pytest.mark.parametrize("obj", ["file", "ranged-file", "manifest"])
def test_an_oversized_remote_object_is_refused_without_reading_it(
    s3_server, s3_remote, tmp_path, monkeypatch, obj
):
    """A bucket writer cannot make a host hold an object bigger than the signed manifest
    declares (or a manifest bigger than any real one) in memory."""
    key = key_of(f"oversized-{obj}")
    host_a = open_tiered(private_store(tmp_path / "a"), s3_remote)
    host_a.get_or_build(key, factors_of(f"oversized-{obj}"), make_build(b"big"))
    manifest = remote_manifest(host_a.remote, key)
    prefix = s3_remote.split("/", 3)[3]
    name = "manifest.json" if obj == "manifest" else f"{tree_id(manifest)}/model.bin"
    huge = 24 << 20
    s3_server.client().put_object(Bucket=BUCKET, Key=f"{prefix}/v1/{key}/{name}", Body=b"{" * huge)

    if obj == "ranged-file":  # the path of files over SINGLE bytes: parallel ranged gets
        monkeypatch.setattr(s3_mod, "SINGLE", 1024)
        monkeypatch.setattr(s3_mod, "PART", 1024)
    b_dir = tmp_path / "b"
    tracemalloc.start()
    try:
        res = runner.invoke(app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(b_dir)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.exit_code == 1
    assert peak < huge // 4, f"{peak} bytes held in memory"
    assert "larger than" in one_error_line(res)
    assert_local_clean(LocalStore(b_dir))
