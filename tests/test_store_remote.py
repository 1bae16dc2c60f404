"""The remote tier against a real SeaweedFS S3 server (no mocks): push, pull, races between
hosts, and the one-line errors of the explicit commands (push, pull, ls, prewarm).

Outages and corruption: test_store_remote_failures.py; signatures: test_store_signing_remote.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.store import s3 as s3_mod
from artifactcache.store.local import LocalStore
from artifactcache.store.remote import check_remote, list_remote, tree_id
from artifactcache.store.s3 import S3Store
from artifactcache.store.tiered import open_tiered
from tests import _remote_util as util
from tests import s3_server as srv
from tests._remote_util import (
    assert_local_clean,
    factors_of,
    fingerprint_of,
    key_of,
    make_build,
    never_build,
    one_error_line,
    private_store,
    remote_manifest,
    strip_signature,
    tree_bytes,
)
from tests.s3_server import READER_KEY, READER_SECRET, _free_ports

# The server fixtures live in tests/s3_server.py and the signing-key one in
# tests/_remote_util.py (not conftest): bind them here.
s3_server = srv.s3_server
s3_remote = srv.s3_remote
builder_key = util.builder_key

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


# ----------------------------------------------------------- push and pull --


def test_host_a_builds_and_pushes_host_b_pulls_without_building(s3_remote, tmp_path, monkeypatch):
    # Small part sizes so a 12 MiB file goes through multipart upload and ranged gets.
    monkeypatch.setattr(s3_mod, "SINGLE", 1 << 20)
    monkeypatch.setattr(s3_mod, "PART", 5 << 20)
    key = key_of("a-b")
    host_a = open_tiered(private_store(tmp_path / "a"), s3_remote)
    entry_a, source = host_a.get_or_build(key, factors_of("a-b"), make_build(big=12 << 20))
    assert source == "built"
    assert remote_manifest(host_a.remote, key)["files"] == entry_a.files

    host_b = open_tiered(private_store(tmp_path / "b"), s3_remote)
    entry_b, source = host_b.get_or_build(key, factors_of("a-b"), never_build)
    assert source == "pulled"
    assert entry_b.files == entry_a.files  # sizes and blake3 digests
    assert tree_bytes(entry_b) == tree_bytes(entry_a)
    stats = host_b.local.stats()
    assert (stats["pulled"], stats["builds"], stats["remote_errors"]) == (1, 0, 0)
    assert host_a.local.stats()["pushes"] == 1
    # A third lookup on B is a plain local hit.
    assert host_b.get_or_build(key, factors_of("a-b"), never_build)[1] == "local"
    rows = list_remote(s3_remote)
    assert [(r["key"], r["complete"], r["size"]) for r in rows] == [(key, True, entry_a.size)]


def test_cli_push_then_pull_on_another_cache(s3_remote, tmp_path):
    key = key_of("cli")
    entry, _ = LocalStore().get_or_build(key, factors_of("cli"), make_build(b"cli"))
    res = runner.invoke(app, ["push", key[:12], "--remote", s3_remote, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["status"] == "pushed"
    res = runner.invoke(app, ["push", key[:12], "--remote", s3_remote, "--json"])
    assert json.loads(res.stdout)[0]["status"] == "exists"

    other = tmp_path / "other"
    res = runner.invoke(app, ["pull", key[:10], "--remote", s3_remote, "--cache-dir", str(other)])
    assert res.exit_code == 0, res.output
    assert "pulled" in res.stdout
    pulled = LocalStore(other, full_verify=True).open(key)
    assert tree_bytes(pulled) == tree_bytes(entry)


# ------------------------------------------------------------------- races --

WORKER = r"""
import json, os, sys, time
from pathlib import Path
from artifactcache.store import remote
from artifactcache.store.local import LocalStore
from artifactcache.store.tiered import open_tiered

cache, url, key, payload, sync, name = sys.argv[1:7]

def barrier(stage):
    # Both hosts upload their files before either writes its manifest: a true race.
    if stage == "manifest":
        Path(sync, str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while len(os.listdir(sync)) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)

def build(work):
    (work / "model.bin").write_bytes(payload.encode() * 1000)
    (work / "extra.txt").write_text("same in both")
    return {}

remote.PUSH_HOOK = barrier
os.makedirs(cache, mode=0o700, exist_ok=True)
store = open_tiered(LocalStore(cache), url)
entry, source = store.get_or_build(key, {"test": "remote", "name": name}, build)
print(json.dumps({"source": source, "files": entry.files, "pushes": store.local.stats()["pushes"]}))
"""


@pytest.mark.parametrize("identical", [True, False], ids=["same-bytes", "different-bytes"])
def test_two_hosts_build_the_same_key_at_once(s3_remote, tmp_path, identical):
    key = key_of(f"race-{identical}")
    sync = tmp_path / "sync"
    sync.mkdir()
    payloads = ["same", "same"] if identical else ["host-a", "host-b"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(tmp_path / f"h{i}"),
                s3_remote,
                key,
                p,
                str(sync),
                f"race-{identical}",
            ],  # fmt: skip
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i, p in enumerate(payloads)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert err == "", err  # no warnings: losing the race is not an error
        outs.append(json.loads(out))
    assert [o["source"] for o in outs] == ["built", "built"]
    assert sorted(o["pushes"] for o in outs) == [0, 1]  # exactly one manifest landed

    remote = S3Store(s3_remote)
    manifest = remote_manifest(remote, key)
    assert manifest["files"] in [o["files"] for o in outs]
    tree = tree_id(manifest)
    expected = sorted(
        [f"v1/{key}/manifest.json"] + [f"v1/{key}/{tree}/{r}" for r in manifest["files"]]
    )
    assert sorted(remote.list(f"v1/{key}")) == expected  # the loser's files are gone

    # Both hosts load a valid entry, and a third host pulls the winner's.
    for i in range(2):
        assert LocalStore(tmp_path / f"h{i}", full_verify=True).open(key).key == key
    host_c = open_tiered(private_store(tmp_path / "c"), s3_remote)
    entry_c, source = host_c.get_or_build(key, {"test": "race"}, never_build)
    assert (source, entry_c.files) == ("pulled", manifest["files"])


# ------------------------------------------------------------ user errors --


@pytest.mark.parametrize(
    ("command", "case", "expected"),
    [
        ("push", "wrong-bucket", "does not exist"),
        ("pull", "wrong-bucket", "does not exist"),
        ("push", "wrong-credentials", "rejected the credentials"),
        ("pull", "wrong-credentials", "rejected the credentials"),
        ("push", "read-only-flag", "read-only"),
        ("push", "read-only-credentials", "permission denied"),
        ("push", "bad-url", "not an s3:// URL"),
        ("push", "no-remote", "no remote configured"),
        ("pull", "missing-key", "has no entry"),
    ],
)
def test_explicit_commands_fail_with_one_line(s3_remote, monkeypatch, command, case, expected):
    key = key_of(f"errors-{command}")
    if command == "push":  # a pull must find nothing locally, or it never asks the remote
        LocalStore().get_or_build(key, factors_of("errors"), make_build(b"e"))
    url = s3_remote
    extra: list[str] = []
    if case == "wrong-bucket":
        url = "s3://no-such-bucket-acache/p"
    elif case == "wrong-credentials":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    elif case == "read-only-flag":
        extra = ["--remote-read-only"]
    elif case == "read-only-credentials":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", READER_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READER_SECRET)
    elif case == "bad-url":
        url = "s3:/oops"
    elif case == "missing-key":
        key = key_of("never-pushed")
    args = [command, key, *extra] + ([] if case == "no-remote" else ["--remote", url])
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    assert expected in one_error_line(res)


def test_check_remote_reports_reachable_readable_writable(s3_server, s3_remote, monkeypatch):
    assert check_remote(s3_remote) == {
        "url": s3_remote,
        "reachable": True,
        "readable": True,
        "writable": True,
        "error": None,
    }
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", READER_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READER_SECRET)
    res = check_remote(s3_remote)
    assert (res["reachable"], res["readable"], res["writable"]) == (True, True, False)
    assert "permission denied" in res["error"]
    res = check_remote("s3://no-such-bucket-acache/p")
    assert (res["reachable"], res["readable"]) == (True, False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_ports(1)[0]}")
    res = check_remote(s3_remote)
    assert (res["reachable"], res["writable"]) == (False, False)
    assert "cannot reach" in res["error"]


def test_ls_remote_lists_complete_and_incomplete_entries(s3_remote, monkeypatch, builder_key):
    key = key_of("ls")
    LocalStore().get_or_build(key, factors_of("ls"), make_build(b"ls"))
    assert runner.invoke(app, ["push", key, "--remote", s3_remote]).exit_code == 0
    # Files without a manifest: what an interrupted push leaves behind.
    half = key_of("ls-half")
    S3Store(s3_remote).put(f"v1/{half}/0123456789abcdef/model.bin", b"x")
    monkeypatch.setenv("ACACHE_REMOTE", s3_remote)
    res = runner.invoke(app, ["ls", "--remote", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["key"]: r for r in json.loads(res.stdout)}
    assert rows[key]["complete"] and rows[key]["files"] == 2
    assert rows[key]["signature"] == fingerprint_of(builder_key)
    assert rows[half] == {"key": half, "complete": False, "problem": "no manifest"}
    res = runner.invoke(app, ["ls", "--remote"])
    assert res.exit_code == 0 and key[:12] in res.stdout and "no manifest" in res.stdout


def test_prewarm_pulls_what_a_recipe_needs_without_building(s3_remote, tmp_path):
    from artifactcache.api import build

    deploy = ["--backend", "eager", "--remote", s3_remote, "--remote-read-only", "--json"]
    res = runner.invoke(app, ["prewarm", "tiny-llama", *deploy, "--cache-dir", str(tmp_path / "d")])
    assert res.exit_code == 1
    assert "has no entry" in one_error_line(res)  # nothing built on the deploy host

    host_a = open_tiered(private_store(tmp_path / "a"), s3_remote)
    built = build("tiny-llama", "eager", store=host_a)
    assert built.source == "built"
    res = runner.invoke(app, ["prewarm", "tiny-llama", *deploy, "--cache-dir", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)[0]
    assert (row["key"], row["status"], row["backend"]) == (built.key, "pulled", "eager")
    assert LocalStore(tmp_path / "d", full_verify=True).open(built.key).files == built.entry.files

    # prewarm checks the signature like every other pull: strip it and it refuses.
    strip_signature(S3Store(s3_remote), built.key)
    res = runner.invoke(app, ["prewarm", "tiny-llama", *deploy, "--cache-dir", str(tmp_path / "e")])
    assert res.exit_code == 1
    assert "is unsigned" in one_error_line(res)
    assert_local_clean(LocalStore(tmp_path / "e"))


def test_remote_without_obstore_is_a_one_line_error(monkeypatch, tmp_path):
    """`--remote` on an install without the s3 extra: one line, exit 1, no traceback."""
    import sys

    from typer.testing import CliRunner

    from artifactcache.cli.app import app

    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore -> ImportError
    monkeypatch.setitem(sys.modules, "obstore.store", None)
    res = CliRunner().invoke(
        app,
        [
            "push",
            "0123456789abcdef",
            "--remote",
            "s3://acache-test/p",
            "--cache-dir",
            str(tmp_path / "c"),
        ],
    )
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "artifactcache[s3]" in lines[0], res.stderr
