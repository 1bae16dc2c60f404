"""S3 object access on obstore: URL parsing, error mapping, big-file transfers.

``S3Store`` is the one ``RemoteStore`` implementation (see ``remote.py``). It
talks to any S3-compatible server (AWS S3, MinIO, Ceph, SeaweedFS, GCS interop)
through obstore, whose Rust client does signing, retries and multipart uploads
without holding the GIL. boto3 is not needed here: obstore covers conditional
puts (``mode="create"``), ranged gets, multipart and listing.

Every failure leaves this module as a one-line :class:`RemoteError` (or an
:class:`IntegrityError` when a local file does not match its digest during a
push), so callers never see obstore's multi-line debug dumps.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..errors import AcacheError, IntegrityError, RemoteError
from ..extras import install_hint

# Parts of this size are uploaded and downloaded in parallel; a file up to
# SINGLE bytes moves in one request (fewer round trips for small files).
PART = 32 << 20
SINGLE = 16 << 20
CONCURRENCY = 8
# Chunk size of whole-object reads: the most held past a limit before the read stops.
STREAM_CHUNK = 1 << 20
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


class _Absent(Exception):
    """The object (not the bucket) does not exist."""


class RemoteUnreachable(RemoteError):
    """No answer at all (refused, timed out): callers may stop trying for a while."""


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without slashes); RemoteError if malformed."""
    text = (url or "").strip()
    hint = "use s3://bucket/prefix (endpoint and credentials come from AWS_* env)"
    if not text.startswith("s3://"):
        raise RemoteError(f"remote {url!r} is not an s3:// URL; {hint}")
    bucket, _, prefix = text[5:].partition("/")
    if not _BUCKET_RE.match(bucket):
        raise RemoteError(f"remote {url!r} has no valid bucket name; {hint}")
    prefix = prefix.strip("/")
    parts = prefix.split("/") if prefix else []
    if any(p in ("", ".", "..") for p in parts) or any(c in prefix for c in "?#\\"):
        raise RemoteError(f"remote {url!r} has an unusable prefix {prefix!r}; {hint}")
    return bucket, prefix


def endpoint_from_env() -> str | None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
        if value := os.environ.get(name, "").strip():
            return value
    return None


def _reason(e: BaseException) -> str:
    """The useful part of an obstore error, in a few words."""
    text = str(e)
    code = re.search(r"<Code>([^<]+)</Code>", text)
    status = re.search(r"status code: (\d{3})", text)
    if code or status:
        parts = [f"HTTP {status.group(1)}" if status else "", code.group(1) if code else ""]
        return " ".join(p for p in parts if p)
    if "kind: Connect" in text or "error sending request" in text:
        return "cannot connect"
    if "timed out" in text.lower() or "kind: Timeout" in text:
        return "timed out"
    return text.splitlines()[0][:160] if text else type(e).__name__


class S3Store:
    """Objects under ``s3://bucket/prefix``; paths given to methods are relative to it."""

    def __init__(self, url: str) -> None:
        self.bucket, self.prefix = parse_url(url)
        try:
            from obstore.store import S3Store as _ObS3Store
        except ImportError:
            raise RemoteError(f"the remote tier needs obstore: {install_hint('s3')}") from None
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.endpoint = endpoint_from_env()
        config: dict[str, Any] = {}
        if self.endpoint:
            config["endpoint"] = self.endpoint
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        config["region"] = region or "us-east-1"
        # Short connect timeout and few retries: a down server must cost seconds,
        # not minutes, because a miss then falls back to a local build. The whole
        # request may take longer, since one part is at most PART bytes.
        client = {
            "allow_http": bool(self.endpoint and self.endpoint.startswith("http://")),
            "connect_timeout": timedelta(seconds=2),
            "timeout": timedelta(seconds=120),
        }
        retry = {
            "max_retries": 2,
            "retry_timeout": timedelta(seconds=5),
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=1),
                "base": 2,
            },
        }
        try:
            self._s = _ObS3Store(
                self.bucket,
                prefix=self.prefix or None,
                config=config,
                client_options=client,
                retry_config=retry,
            )
        except Exception as e:  # obstore rejects bad config values with its own errors
            raise RemoteError(f"cannot configure remote {self.url}: {_reason(e)}") from None

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    # ------------------------------------------------------------- errors --

    def _error(self, op: str, path: str, e: BaseException) -> Exception:
        reason = _reason(e)
        where = f"{self.url}/{path}" if path else self.url
        if "NoSuchBucket" in reason:
            return RemoteError(f"bucket {self.bucket!r} does not exist at {self.endpoint or 'AWS'}")
        if any(c in reason for c in ("SignatureDoesNotMatch", "InvalidAccessKeyId")):
            return RemoteError(
                f"remote {self.url} rejected the credentials ({reason}); "
                "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
            )
        if "HTTP 403" in reason or "AccessDenied" in reason:
            return RemoteError(f"permission denied: {op} {where} ({reason})")
        if reason in ("cannot connect", "timed out"):
            return RemoteUnreachable(
                f"cannot reach remote {self.endpoint or self.url} ({op} {where}: {reason})"
            )
        if isinstance(e, FileNotFoundError):
            return _Absent(path)
        return RemoteError(f"remote {op} {where} failed: {reason}")

    def _call(self, op: str, path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AcacheError:
            raise  # e.g. IntegrityError from a push's digest check, passed through obstore
        except Exception as e:
            raise self._error(op, path, e) from None

    # --------------------------------------------------------- RemoteStore --

    def get(self, path: str, *, limit: int) -> bytes | None:
        """A whole small object, or None if absent; IntegrityError if over ``limit`` bytes."""
        try:
            chunks = self._stream(path, limit)
            return None if chunks is None else b"".join(chunks)
        except _Absent:  # deleted while we read it
            return None

    def _stream(self, path: str, limit: int) -> Iterator[bytes] | None:
        """The object's bytes in chunks, or None if absent: the one whole-object read.

        An object that declares more than ``limit`` bytes is an IntegrityError before
        its body is read; one that sends more than it declared, at the first chunk
        past ``limit``. So a bucket writer cannot make a host hold more than the
        signed manifest (or, for a manifest object, manifest.ENVELOPE_MAX_BYTES) allows.
        """
        import obstore

        try:
            result = self._call("get", path, obstore.get, self._s, path)
        except _Absent:
            return None
        declared = int(result.meta["size"])
        if declared > limit:
            raise _too_large(path, declared, limit)
        return self._chunks(path, iter(result.stream(min_chunk_size=STREAM_CHUNK)), limit)

    def _chunks(self, path: str, stream: Iterator[bytes], limit: int) -> Iterator[bytes]:
        seen = 0
        while True:
            try:
                chunk = next(stream)
            except StopIteration:
                return
            except Exception as e:
                raise self._error("get", path, e) from None
            seen += len(chunk)
            if seen > limit:
                raise _too_large(path, seen, limit)
            yield chunk

    def exists(self, path: str) -> bool:
        import obstore

        try:
            self._call("head", path, obstore.head, self._s, path)
            return True
        except _Absent:
            return False

    def put(self, path: str, data: bytes, *, create: bool = False) -> bool:
        """Write a small object; with create=True only if absent (If-None-Match).

        Returns False when ``create`` lost to an object already there.
        """
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            mode = "create" if create else "overwrite"
            obstore.put(self._s, path, data, mode=mode, use_multipart=False)
            return True
        except (AlreadyExistsError, PreconditionError):
            return False
        except Exception as e:
            raise self._error("put", path, e) from None

    def list(self, prefix: str = "", *, dirs: bool = False) -> list[str]:
        """Object paths under ``prefix``; with dirs=True the next level's names only."""
        import obstore

        base = prefix.rstrip("/") + "/" if prefix else ""
        if dirs:
            res = self._call("list", prefix, obstore.list_with_delimiter, self._s, base or None)
            return [p[len(base) :].rstrip("/") for p in res["common_prefixes"]]
        out: list[str] = []
        stream = self._call("list", prefix, obstore.list, self._s, base or None, chunk_size=1000)
        for batch in self._call("list", prefix, list, stream):
            out.extend(o["path"] for o in batch)
        return out

    def delete(self, paths: list[str]) -> None:
        import obstore

        if paths:
            try:
                self._call("delete", paths[0], obstore.delete, self._s, paths)
            except _Absent:
                pass

    def check(self) -> dict[str, Any]:
        """Reachable (the server answered), readable (list + get), writable (put + delete)."""
        out: dict[str, Any] = {"url": self.url, "endpoint": self.endpoint}
        out.update(reachable=False, readable=False, writable=False, error=None)
        try:
            self.list("v1", dirs=True)
            out.update(reachable=True, readable=True)
            probe = f"v1/.acache-probe-{uuid.uuid4().hex}"
            self.put(probe, b"probe")
            self.delete([probe])
            out["writable"] = True
        except RemoteError as e:
            out["error"] = str(e)
            out["reachable"] = "cannot reach" not in str(e)
        return out

    # ------------------------------------------------------ big transfers --

    def upload_file(self, path: str, src: Path, size: int, digest: str) -> None:
        """Upload ``src``, hashing it in the same pass; IntegrityError if it is not ``digest``.

        The hash check runs before the last byte is handed over, so a file that
        changed on disk is never completed on the remote: obstore aborts the
        multipart upload when the iterator raises.
        """
        import obstore

        chunks = _verified_chunks(src, size, digest)
        if size <= SINGLE:
            data = b"".join(chunks)  # checks the digest before anything is sent
            self._call("put", path, obstore.put, self._s, path, data, use_multipart=False)
            return
        self._call(
            "put",
            path,
            obstore.put,
            self._s,
            path,
            chunks,
            chunk_size=PART,
            max_concurrency=CONCURRENCY,
        )

    def download_file(self, path: str, dest: Path, size: int) -> None:
        """Fetch exactly ``size`` bytes into a new file ``dest`` (ranged gets in parallel).

        Digests are checked by the caller (LocalStore.publish_dir) on the whole
        tree; here a missing object or a size mismatch is an IntegrityError, and
        no more than ``size`` bytes of the object are ever read.
        """
        import obstore

        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            if size <= SINGLE:
                chunks = self._stream(path, size)
                if chunks is None:
                    raise IntegrityError(f"remote object {path} is missing")
                got = 0
                for chunk in chunks:
                    _write_all(fd, chunk)
                    got += len(chunk)
                if got != size:
                    raise IntegrityError(f"remote object {path} is {got} bytes, not {size}")
                return
            # Sized first, so an object larger than the manifest says is refused unread;
            # each ranged get below is bounded by its range.
            meta = self._call("head", path, obstore.head, self._s, path)
            if int(meta["size"]) > size:
                raise _too_large(path, int(meta["size"]), size)
            if int(meta["size"]) < size:
                raise IntegrityError(f"remote object {path} is {meta['size']} bytes, not {size}")
            os.ftruncate(fd, size)

            def fetch(start: int) -> None:
                end = min(size, start + PART)
                try:
                    buf = self._call(
                        "get", path, obstore.get_range, self._s, path, start=start, end=end
                    )
                except _Absent:
                    raise IntegrityError(f"remote object {path} is missing") from None
                if len(buf) != end - start:
                    raise IntegrityError(f"remote object {path} is shorter than {size} bytes")
                os.pwrite(fd, memoryview(buf), start)

            with ThreadPoolExecutor(CONCURRENCY) as pool:
                for fut in [pool.submit(fetch, s) for s in range(0, size, PART)]:
                    fut.result()
        except _Absent:
            raise IntegrityError(f"remote object {path} is missing") from None
        finally:
            os.close(fd)


def _too_large(path: str, got: int, limit: int) -> IntegrityError:
    return IntegrityError(f"remote object {path} is {got} bytes, larger than the {limit} expected")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _verified_chunks(src: Path, size: int, digest: str) -> Iterator[bytes]:
    """The file's bytes in PART-sized chunks; raises IntegrityError at EOF on a mismatch."""
    import blake3

    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    seen = 0
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "rb", buffering=0) as f:
            while chunk := f.read(PART):
                h.update(chunk)
                seen += len(chunk)
                if seen > size:
                    break
                yield chunk
    except OSError as e:  # removed or replaced under us (rm/gc racing a push)
        raise IntegrityError(
            f"local file {src.name} of entry is unreadable ({e.strerror or e}); "
            "nothing was pushed (run `acache verify`)"
        ) from None
    if seen != size or f"blake3:{h.hexdigest()}" != digest:
        raise IntegrityError(
            f"local file {src.name} of entry no longer matches its manifest; "
            "nothing was pushed (run `acache verify`)"
        )
