"""The remote tier against a real SeaweedFS S3 server (no mocks): push, pull, races,
outages, corruption, signatures, and the one-line errors of the explicit commands."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.errors import KeyLookupError
from artifactcache.keys import compute_key
from artifactcache.store import remote as remote_mod
from artifactcache.store import s3 as s3_mod
from artifactcache.store.local import LocalStore
from artifactcache.store.remote import (
    check_remote,
    list_remote,
    open_tiered,
    read_manifest,
    tree_id,
)
from artifactcache.store.s3 import S3Store
from artifactcache.store.signing import fingerprint, generate_key, load_signer
from tests import s3_server as srv
from tests.s3_server import BUCKET, READER_KEY, READER_SECRET, SeaweedServer, _free_ports

# The server fixtures live in tests/s3_server.py (not conftest): bind them here.
s3_server = srv.s3_server
s3_remote = srv.s3_remote

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(autouse=True)
def builder_key(tmp_path_factory, monkeypatch) -> Path:
    """Every host in these tests is a builder with one fleet key, trusted by all, unless a
    test says otherwise; the key's public line is in ``<key>.pub``."""
    path = tmp_path_factory.mktemp("keys") / "builder"
    generate_key(path, "builder")
    monkeypatch.setenv("ACACHE_SIGNING_KEY", str(path))
    monkeypatch.setenv("ACACHE_TRUSTED_KEYS", f"{path}.pub")
    monkeypatch.delenv("ACACHE_REMOTE_TRUST_UNSIGNED", raising=False)
    return path


def _manifest(remote, key: str) -> dict | None:
    """The remote manifest as stored, signature unchecked (for assertions only)."""
    found = read_manifest(remote, key)
    return found[0] if found else None


def _key(name: str) -> str:
    return compute_key({"test": "remote", "name": name})


def _factors(name: str) -> dict:
    return {"test": "remote", "name": name}


def _builder(payload: bytes = b"weights", big: int = 0):
    """A build writing a few files; ``big`` adds a file that needs multipart/ranged transfers."""

    def build(work: Path) -> dict:
        (work / "model.bin").write_bytes(payload * 500)
        (work / "sub").mkdir()
        (work / "sub" / "config.json").write_text('{"layers": 2}')
        if big:
            (work / "sub" / "big.bin").write_bytes(os.urandom(big))
        return {"payload": payload.decode()}

    return build


def _never(work: Path) -> dict:
    raise AssertionError("this host must not build")


def _store(path: Path) -> LocalStore:
    path.mkdir(mode=0o700, exist_ok=True)
    return LocalStore(path)


def _tree_bytes(entry) -> dict[str, bytes]:
    return {rel: (entry.path / rel).read_bytes() for rel in entry.files}


def _one_line(result, prefix: str = "error: ") -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    return lines[0]


def _local_is_clean(store: LocalStore) -> None:
    entries, _ = store.scan()
    assert entries == []
    for sub in ("staging", "quarantine"):
        assert list((store.base / sub).iterdir()) == [], sub


# ----------------------------------------------------------- push and pull --


def test_host_a_builds_and_pushes_host_b_pulls_without_building(s3_remote, tmp_path, monkeypatch):
    # Small part sizes so a 12 MiB file goes through multipart upload and ranged gets.
    monkeypatch.setattr(s3_mod, "SINGLE", 1 << 20)
    monkeypatch.setattr(s3_mod, "PART", 5 << 20)
    key = _key("a-b")
    host_a = open_tiered(_store(tmp_path / "a"), s3_remote)
    entry_a, source = host_a.get_or_build(key, _factors("a-b"), _builder(big=12 << 20))
    assert source == "built"
    assert _manifest(host_a.remote, key)["files"] == entry_a.files

    host_b = open_tiered(_store(tmp_path / "b"), s3_remote)
    entry_b, source = host_b.get_or_build(key, _factors("a-b"), _never)
    assert source == "pulled"
    assert entry_b.files == entry_a.files  # sizes and blake3 digests
    assert _tree_bytes(entry_b) == _tree_bytes(entry_a)
    stats = host_b.local.stats()
    assert (stats["pulled"], stats["builds"], stats["remote_errors"]) == (1, 0, 0)
    assert host_a.local.stats()["pushes"] == 1
    # A third lookup on B is a plain local hit.
    assert host_b.get_or_build(key, _factors("a-b"), _never)[1] == "local"
    rows = list_remote(s3_remote)
    assert [(r["key"], r["complete"], r["size"]) for r in rows] == [(key, True, entry_a.size)]


def test_cli_push_then_pull_on_another_cache(s3_remote, tmp_path):
    key = _key("cli")
    entry, _ = LocalStore().get_or_build(key, _factors("cli"), _builder(b"cli"))
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
    assert _tree_bytes(pulled) == _tree_bytes(entry)


# ------------------------------------------------------------------- races --

WORKER = r"""
import json, os, sys, time
from pathlib import Path
from artifactcache.store import remote
from artifactcache.store.local import LocalStore
from artifactcache.store.remote import open_tiered

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
    key = _key(f"race-{identical}")
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
    manifest = _manifest(remote, key)
    assert manifest["files"] in [o["files"] for o in outs]
    tree = tree_id(manifest)
    expected = sorted(
        [f"v1/{key}/manifest.json"] + [f"v1/{key}/{tree}/{r}" for r in manifest["files"]]
    )
    assert sorted(remote.list(f"v1/{key}")) == expected  # the loser's files are gone

    # Both hosts load a valid entry, and a third host pulls the winner's.
    for i in range(2):
        assert LocalStore(tmp_path / f"h{i}", full_verify=True).open(key).key == key
    host_c = open_tiered(_store(tmp_path / "c"), s3_remote)
    entry_c, source = host_c.get_or_build(key, {"test": "race"}, _never)
    assert (source, entry_c.files) == ("pulled", manifest["files"])


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
    key = _key("outage-explicit")
    entry, _ = LocalStore().get_or_build(key, _factors("outage-explicit"), _builder(b"out"))
    monkeypatch.setattr(remote_mod, "PUSH_HOOK", _kill_after_first_file(s3_server))
    res = runner.invoke(app, ["push", key[:12], "--remote", s3_remote])
    assert res.exit_code == 1
    assert "cannot reach remote" in _one_line(res)
    assert LocalStore(full_verify=True).open(key).files == entry.files  # local entry intact

    monkeypatch.setattr(remote_mod, "PUSH_HOOK", None)
    s3_server.start()
    assert _manifest(S3Store(s3_remote), key) is None  # readers never saw half a push
    res = runner.invoke(app, ["push", key[:12], "--remote", s3_remote])
    assert res.exit_code == 0, res.output
    assert "pushed" in res.stdout
    host_b = open_tiered(_store(tmp_path / "b"), s3_remote)
    assert _tree_bytes(host_b.open(key)) == _tree_bytes(entry)


def test_server_killed_mid_implicit_push_only_warns(
    s3_server, s3_remote, tmp_path, monkeypatch, capsys
):
    key = _key("outage-implicit")
    monkeypatch.setattr(remote_mod, "PUSH_HOOK", _kill_after_first_file(s3_server))
    host_a = open_tiered(_store(tmp_path / "a"), s3_remote)
    entry, source = host_a.get_or_build(key, _factors("outage-implicit"), _builder(b"imp"))
    assert source == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: push of ") and "acache push" in err[0]
    assert host_a.local.stats()["remote_errors"] == 1
    assert LocalStore(tmp_path / "a", full_verify=True).open(key).files == entry.files

    monkeypatch.setattr(remote_mod, "PUSH_HOOK", None)
    s3_server.start()
    assert host_a.push(key)["status"] == "pushed"
    host_b = open_tiered(_store(tmp_path / "b"), s3_remote)
    assert host_b.get_or_build(key, _factors("outage-implicit"), _never)[1] == "pulled"


def test_remote_down_is_a_warning_and_a_miss(tmp_path, monkeypatch, capsys):
    (port,) = _free_ports(1)  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    store = open_tiered(_store(tmp_path / "a"), f"s3://{BUCKET}/down")
    key = _key("down")
    entry, source = store.get_or_build(key, _factors("down"), _builder(b"down"))
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
    key = _key("corrupt")
    host_a = open_tiered(_store(tmp_path / "a"), s3_remote)
    entry, _ = host_a.get_or_build(key, _factors("corrupt"), _builder(b"good"))
    manifest = _manifest(host_a.remote, key)
    prefix = s3_remote.split("/", 3)[3]
    obj = f"{prefix}/v1/{key}/{tree_id(manifest)}/model.bin"
    client = s3_server.client()
    data = client.get_object(Bucket=BUCKET, Key=obj)["Body"].read()
    client.put_object(Bucket=BUCKET, Key=obj, Body=bytes([data[0] ^ 1]) + data[1:])

    b_dir = tmp_path / "b"
    res = runner.invoke(app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(b_dir)])
    assert res.exit_code == 1
    assert "failed verification" in _one_line(res)
    _local_is_clean(LocalStore(b_dir))

    # In a build path the corrupt copy is a warning and a miss; the verified rebuild
    # replaces the remote copy, so a third host pulls a good one.
    capsys.readouterr()
    host_b = open_tiered(LocalStore(b_dir), s3_remote)
    assert host_b.get_or_build(key, _factors("corrupt"), _builder(b"good"))[1] == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "failed verification" in err[0]
    host_c = open_tiered(_store(tmp_path / "c"), s3_remote)
    assert _tree_bytes(host_c.open(key)) == _tree_bytes(entry)


def test_corrupted_remote_manifest_fails_pull_and_push_replaces_it(s3_server, s3_remote, tmp_path):
    key = _key("bad-manifest")
    entry, _ = LocalStore().get_or_build(key, _factors("bad-manifest"), _builder(b"m"))
    prefix = s3_remote.split("/", 3)[3]
    s3_server.client().put_object(Bucket=BUCKET, Key=f"{prefix}/v1/{key}/manifest.json", Body=b"{")
    res = runner.invoke(
        app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "b")]
    )
    assert res.exit_code == 1
    assert "not valid JSON" in _one_line(res)
    _local_is_clean(LocalStore(tmp_path / "b"))
    res = runner.invoke(app, ["push", key, "--remote", s3_remote])
    assert res.exit_code == 0 and "pushed" in res.stdout, res.output
    res = runner.invoke(
        app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "b")]
    )
    assert res.exit_code == 0, res.output
    assert _tree_bytes(LocalStore(tmp_path / "b").open(key)) == _tree_bytes(entry)


def test_push_of_a_locally_damaged_entry_sends_nothing(s3_remote):
    key = _key("damaged")
    entry, _ = LocalStore().get_or_build(key, _factors("damaged"), _builder(b"dmg"))
    target = entry.path / "model.bin"
    target.chmod(0o600)
    data = target.read_bytes()
    target.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size: only the digest can tell
    res = runner.invoke(app, ["push", key, "--remote", s3_remote])
    assert res.exit_code == 1
    assert "no longer matches its manifest" in _one_line(res)
    remote = S3Store(s3_remote)
    assert _manifest(remote, key) is None
    assert not [p for p in remote.list(f"v1/{key}") if p.endswith("model.bin")]


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
    key = _key(f"errors-{command}")
    if command == "push":  # a pull must find nothing locally, or it never asks the remote
        LocalStore().get_or_build(key, _factors("errors"), _builder(b"e"))
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
        key = _key("never-pushed")
    args = [command, key, *extra] + ([] if case == "no-remote" else ["--remote", url])
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    assert expected in _one_line(res)


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
    key = _key("ls")
    LocalStore().get_or_build(key, _factors("ls"), _builder(b"ls"))
    assert runner.invoke(app, ["push", key, "--remote", s3_remote]).exit_code == 0
    # Files without a manifest: what an interrupted push leaves behind.
    half = _key("ls-half")
    S3Store(s3_remote).put(f"v1/{half}/0123456789abcdef/model.bin", b"x")
    monkeypatch.setenv("ACACHE_REMOTE", s3_remote)
    res = runner.invoke(app, ["ls", "--remote", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["key"]: r for r in json.loads(res.stdout)}
    assert rows[key]["complete"] and rows[key]["files"] == 2
    assert rows[key]["signature"] == _fingerprint_of(builder_key)
    assert rows[half] == {"key": half, "complete": False, "problem": "no manifest"}
    res = runner.invoke(app, ["ls", "--remote"])
    assert res.exit_code == 0 and key[:12] in res.stdout and "no manifest" in res.stdout


def test_prewarm_pulls_what_a_recipe_needs_without_building(s3_remote, tmp_path):
    from artifactcache.api import build

    deploy = ["--backend", "eager", "--remote", s3_remote, "--remote-read-only", "--json"]
    res = runner.invoke(app, ["prewarm", "tiny-llama", *deploy, "--cache-dir", str(tmp_path / "d")])
    assert res.exit_code == 1
    assert "has no entry" in _one_line(res)  # nothing built on the deploy host

    host_a = open_tiered(_store(tmp_path / "a"), s3_remote)
    built = build("tiny-llama", "eager", store=host_a)
    assert built.source == "built"
    res = runner.invoke(app, ["prewarm", "tiny-llama", *deploy, "--cache-dir", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)[0]
    assert (row["key"], row["status"], row["backend"]) == (built.key, "pulled", "eager")
    assert LocalStore(tmp_path / "d", full_verify=True).open(built.key).files == built.entry.files

    # prewarm checks the signature like every other pull: strip it and it refuses.
    _strip_signature(S3Store(s3_remote), built.key)
    res = runner.invoke(app, ["prewarm", "tiny-llama", *deploy, "--cache-dir", str(tmp_path / "e")])
    assert res.exit_code == 1
    assert "is unsigned" in _one_line(res)
    _local_is_clean(LocalStore(tmp_path / "e"))


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


# -------------------------------------------------------------- signatures --


def _fingerprint_of(private_key: Path) -> str:
    return fingerprint(Path(f"{private_key}.pub").read_text())


def _envelope(remote: S3Store, key: str) -> dict:
    return json.loads(remote.get(f"v1/{key}/manifest.json"))


def _strip_signature(remote: S3Store, key: str) -> None:
    """Replace a signed remote manifest by its bare payload: an unsigned entry."""
    payload = base64.b64decode(_envelope(remote, key)["manifest"])
    remote.put(f"v1/{key}/manifest.json", payload)


def _forge(remote: S3Store, key: str, how: str, attacker_key: Path) -> bytes:
    """What anyone with write access to the bucket can do: put their own bytes in
    model.bin, recompute its digest (and so the tree), upload the files under the new
    tree, and rewrite the manifest. Returns the planted bytes."""
    envelope = _envelope(remote, key)
    original = json.loads(base64.b64decode(envelope["manifest"]))
    manifest = json.loads(json.dumps(original))
    evil = b"attacker" * 300
    manifest["files"]["model.bin"] = {
        "size": len(evil),
        "digest": f"blake3:{blake3.blake3(evil).hexdigest()}",
    }
    for rel in manifest["files"]:
        data = evil if rel == "model.bin" else remote.get(f"v1/{key}/{tree_id(original)}/{rel}")
        remote.put(f"v1/{key}/{tree_id(manifest)}/{rel}", data)
    payload = json.dumps(manifest, indent=1, sort_keys=True).encode()
    if how == "old-signature":  # the builder's signature kept, over the old manifest
        envelope["manifest"] = base64.b64encode(payload).decode()
        body = json.dumps(envelope).encode()
    elif how == "unsigned":
        body = payload
    else:  # signed, validly, by a key nobody trusts
        body = load_signer(attacker_key).seal(key, payload)
    remote.put(f"v1/{key}/manifest.json", body)
    return evil


@pytest.mark.parametrize(
    ("how", "expected", "digests_alone_accept"),
    [
        ("old-signature", "does not verify", False),
        ("unsigned", "is unsigned", True),
        ("untrusted-key", "not a trusted key", True),
    ],
)
def test_tampered_file_with_recomputed_digests_is_refused(
    s3_remote, tmp_path, capsys, how, expected, digests_alone_accept
):
    key = _key(f"forged-{how}")
    builder = open_tiered(_store(tmp_path / "a"), s3_remote)
    good, _ = builder.get_or_build(key, _factors(f"forged-{how}"), _builder(b"good"))
    attacker = tmp_path / "attacker"
    generate_key(attacker, "attacker")
    evil = _forge(builder.remote, key, how, attacker)

    # The forgery is consistent: a host that checks digests only takes the planted
    # bytes. (A signature that does not verify is refused even there.)
    lax = open_tiered(_store(tmp_path / "lax"), s3_remote, signing_key="", trust_unsigned=True)
    lax_entry = lax.get(key)
    if digests_alone_accept:
        assert (lax_entry.path / "model.bin").read_bytes() == evil
    else:
        assert lax_entry is None
    capsys.readouterr()

    # A deployment host that trusts the builder's key: one warning, a miss, nothing published.
    deploy = open_tiered(_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    assert deploy.get(key) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and expected in err[0], err
    _local_is_clean(deploy.local)
    entry, source = deploy.get_or_build(key, _factors(f"forged-{how}"), _builder(b"good"))
    assert source == "built"
    assert _tree_bytes(entry) == _tree_bytes(good)

    # The explicit pull: one error line, exit 1, the local cache untouched.
    b_dir = tmp_path / "b"
    res = runner.invoke(app, ["pull", key, "--remote", s3_remote, "--cache-dir", str(b_dir)])
    assert res.exit_code == 1
    line = _one_line(res)
    assert expected in line and "nothing was pulled" in line
    # Only where it could help does the message suggest --remote-trust-unsigned.
    assert ("--remote-trust-unsigned" in line) == digests_alone_accept
    _local_is_clean(LocalStore(b_dir))


def test_unsigned_entry_is_refused_by_default_and_used_with_trust_unsigned(
    s3_remote, tmp_path, capsys, monkeypatch
):
    key = _key("unsigned")
    # A host without a signing key that trusts unsigned entries pushes unsigned, and says so.
    lax = open_tiered(_store(tmp_path / "a"), s3_remote, signing_key="", trust_unsigned=True)
    entry, _ = lax.get_or_build(key, _factors("unsigned"), _builder(b"u"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: pushing {key[:12]} unsigned"), err
    assert _envelope(lax.remote, key)["key"] == key  # a bare manifest, no envelope

    deploy = open_tiered(_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    assert deploy.get(key) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is unsigned" in err[0], err
    with pytest.raises(KeyLookupError):
        deploy.open(key)
    _local_is_clean(deploy.local)

    pull = ["pull", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "b")]
    res = runner.invoke(app, pull)
    assert res.exit_code == 1
    assert "is unsigned" in _one_line(res)
    _local_is_clean(LocalStore(tmp_path / "b"))
    res = runner.invoke(app, [*pull, "--remote-trust-unsigned"])
    assert res.exit_code == 0, res.output
    assert _tree_bytes(LocalStore(tmp_path / "b").open(key)) == _tree_bytes(entry)

    monkeypatch.setenv("ACACHE_REMOTE_TRUST_UNSIGNED", "1")  # the flag's variable
    env_host = open_tiered(_store(tmp_path / "e"), s3_remote, read_only=True, signing_key="")
    assert _tree_bytes(env_host.get(key)) == _tree_bytes(entry)


def test_entry_signed_by_an_untrusted_key_is_refused_until_its_key_is_trusted(
    s3_remote, tmp_path, capsys, builder_key
):
    key = _key("other-builder")
    other = tmp_path / "other"
    generate_key(other, "other-builder")
    host_x = open_tiered(_store(tmp_path / "x"), s3_remote, signing_key=other, trusted_keys=[])
    entry, _ = host_x.get_or_build(key, _factors("other-builder"), _builder(b"x"))
    assert _envelope(host_x.remote, key)["signer"].split()[1] in Path(f"{other}.pub").read_text()

    # This host trusts only the fleet's builder key.
    deploy = open_tiered(_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    assert deploy.get(key) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a trusted key" in err[0] and _fingerprint_of(other) in err[0]
    _local_is_clean(deploy.local)

    # One trusted-keys file may hold several keys (comments and blank lines allowed),
    # and --trusted-keys takes several files.
    fleet = tmp_path / "fleet.pub"
    fleet.write_text(f"# the fleet's builders\n{Path(f'{builder_key}.pub').read_text()}\n\n")
    fleet.write_text(fleet.read_text() + Path(f"{other}.pub").read_text())
    both = open_tiered(_store(tmp_path / "e"), s3_remote, signing_key="", trusted_keys=str(fleet))
    assert _tree_bytes(both.get(key)) == _tree_bytes(entry)
    res = runner.invoke(
        app,
        ["pull", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "f")]
        + ["--trusted-keys", f"{builder_key}.pub,{other}.pub"],
    )
    assert res.exit_code == 0, res.output
    assert _tree_bytes(LocalStore(tmp_path / "f").open(key)) == _tree_bytes(entry)


def test_a_good_signed_entry_round_trips_to_a_host_with_only_the_public_key(
    s3_remote, tmp_path, builder_key
):
    key = _key("signed")
    builder = open_tiered(_store(tmp_path / "a"), s3_remote)
    entry, _ = builder.get_or_build(key, _factors("signed"), _builder(b"s"))
    envelope = _envelope(builder.remote, key)
    assert envelope["format"] == "acache-signed-manifest/1"
    assert fingerprint(envelope["signer"]) == _fingerprint_of(builder_key)
    deploy = open_tiered(_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    pulled, source = deploy.get_or_build(key, _factors("signed"), _never)
    assert source == "pulled" and _tree_bytes(pulled) == _tree_bytes(entry)
    # The local manifest is the signed payload, byte for byte in meaning.
    assert pulled.manifest == json.loads(base64.b64decode(envelope["manifest"]))


def test_a_builder_replaces_an_unsigned_remote_copy_with_a_signed_one(
    s3_remote, tmp_path, capsys, builder_key
):
    key = _key("migrate")
    lax = open_tiered(_store(tmp_path / "old"), s3_remote, signing_key="", trust_unsigned=True)
    lax.get_or_build(key, _factors("migrate"), _builder(b"m"))
    capsys.readouterr()
    builder = open_tiered(_store(tmp_path / "a"), s3_remote)
    entry, source = builder.get_or_build(key, _factors("migrate"), _builder(b"m"))
    assert source == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is unsigned" in err[0], err  # the refusal; the push is silent
    assert fingerprint(_envelope(builder.remote, key)["signer"]) == _fingerprint_of(builder_key)
    deploy = open_tiered(_store(tmp_path / "d"), s3_remote, read_only=True, signing_key="")
    assert deploy.get_or_build(key, _factors("migrate"), _never)[1] == "pulled"


def test_push_without_a_signing_key_is_refused(s3_remote, tmp_path, capsys, monkeypatch):
    key = _key("no-signing-key")
    host = open_tiered(_store(tmp_path / "a"), s3_remote, signing_key="")
    entry, source = host.get_or_build(key, _factors("no-signing-key"), _builder(b"n"))
    assert source == "built"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "skipped: no signing key" in err[0], err
    assert _manifest(host.remote, key) is None  # nothing unsigned reached the fleet

    monkeypatch.delenv("ACACHE_SIGNING_KEY")
    res = runner.invoke(
        app, ["push", key, "--remote", s3_remote, "--cache-dir", str(tmp_path / "a")]
    )
    assert res.exit_code == 1
    assert "no signing key" in _one_line(res)
    assert S3Store(s3_remote).list(f"v1/{key}") == []
