"""A server-less stand-in for S3 in the store tests (not a test module): the
RemoteStore protocol over a dict. The protocol itself is tested against SeaweedFS."""

from __future__ import annotations

from pathlib import Path

from artifactcache.errors import IntegrityError


class MemoryBucket:
    """The RemoteStore protocol over a dict; ``writes`` lists every path put."""

    def __init__(self, url: str = "mem://fleet") -> None:
        self.url = url
        self.objects: dict[str, bytes] = {}
        self.writes: list[str] = []

    def get(self, path: str, *, limit: int | None = None) -> bytes | None:
        return self.objects.get(path)

    def put(self, path: str, data: bytes, *, create: bool = False) -> bool:
        if create and path in self.objects:
            return False
        self.objects[path] = bytes(data)
        self.writes.append(path)
        return True

    def exists(self, path: str) -> bool:
        return path in self.objects

    def list(self, prefix: str = "", *, dirs: bool = False) -> list[str]:
        base = prefix.rstrip("/") + "/" if prefix else ""
        rest = [p[len(base) :] for p in self.objects if p.startswith(base)]
        return sorted({r.split("/")[0] for r in rest}) if dirs else [base + r for r in rest]

    def delete(self, paths: list[str]) -> None:
        for p in paths:
            self.objects.pop(p, None)

    def check(self) -> dict:
        return {"url": self.url, "reachable": True, "readable": True, "writable": True}

    def upload_file(self, path: str, src: Path, size: int, digest: str) -> None:
        self.put(path, src.read_bytes())

    def download_file(self, path: str, dest: Path, size: int) -> None:
        if (data := self.objects.get(path)) is None:
            raise IntegrityError(f"remote object {path} is missing")
        dest.write_bytes(data)
