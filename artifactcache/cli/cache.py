"""Cache commands: ls, show, verify, rm, gc, prune, stats, export, import.

Thin by design: parse the arguments, call the store, render a
rich table or ``--json``. Errors are AcacheError subclasses; app.py prints them.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator
from json import dumps
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ArgumentError, BundleError, FilesystemError, IntegrityError
from ..limits import SIZE_MAX
from .app import (
    AllowSharedRoot,
    CacheDir,
    JsonOut,
    check_prefixes,
    open_store,
)
from .remote import RemoteFlag, RemoteUrl, ls_remote
from .render import (
    console,
    emit_json,
    err_console,
    human_bytes,
    n_entries,
    print_table,
    shown,
    visible,
)

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SI = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``10G``, ``500MiB``, ``1.5g``, ``2GB`` (SI), ``4096`` -> bytes. K/M/G/T are binary."""
    m = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([kmgt]?)(i?b?)\s*", text.lower())
    if m and not (m.group(2) == "" and m.group(3) not in ("", "b")):
        num, unit, suffix = float(m.group(1)), m.group(2), m.group(3)
        mult = _SI[unit + "b"] if suffix == "b" and unit else _UNITS[unit]
        if num * mult > SIZE_MAX:
            raise ArgumentError(f"--max-size {text[:40]!r} is past 8 EiB; give a real size")
        return int(num * mult)
    raise ArgumentError(f"--max-size {text[:40]!r} is not a size; use e.g. 10G, 500MiB or 2GB")


def parse_duration(text: str) -> float:
    """``7d``, ``12h``, ``1d12h``, ``30m``, ``90s``, ``2w`` -> seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", text.lower().replace(" ", ""))
    if not parts or "".join(a + b for a, b in parts) != text.lower().replace(" ", ""):
        raise ArgumentError(f"--older-than {text!r} is not a duration; use e.g. 7d, 12h or 1d12h")
    return sum(float(n) * _SECONDS[u] for n, u in parts)


def _ago(t: float) -> str:
    d = max(0.0, time.time() - t)
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= secs:
            return f"{d / secs:.0f}{unit} ago"
    return f"{d:.0f}s ago"


def _when(t: float) -> str:
    """An epoch time as local date and time, then how long ago."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} ({_ago(t)})"


def _shown_field(name: str, value: Any) -> str:
    """A summary field as `show` prints it: times and sizes read as people read them,
    a label as its choices; --json keeps the raw values."""
    if name in ("created", "last_used") and isinstance(value, (int, float)):
        return _when(float(value))
    if name == "size" and isinstance(value, int):
        return f"{human_bytes(value)} ({value} bytes)"
    if name == "build_seconds" and isinstance(value, (int, float)):
        return _duration(float(value))
    if name == "label" and isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items() if v is not None) or "-"
    if name == "depends_on" and isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return "-" if value is None else str(value)


@contextlib.contextmanager
def _progress(what: str, *, entries: bool = False) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr, only when stderr is a terminal; it counts bytes,
    or with ``entries`` the entries done."""
    if not err_console.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    count = [MofNCompleteColumn(), TextColumn("entries")] if entries else [DownloadColumn()]
    cols = [TextColumn(what), BarColumn(), *count, TimeRemainingColumn()]
    with Progress(*cols, console=err_console, transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


STAT_LABELS = {
    "bytes_served": "served from the cache",
    "build_seconds": "build time spent",
    "build_seconds_saved": "build time saved by hits",
    "bytes": "size on disk",
    "remote_errors": "remote errors",
}


def _duration(seconds: float) -> str:
    """1.2 s, 4 min 5 s, 2 h 3 min: a time as a person reads it."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _stat_value(name: str, value: Any) -> str:
    if name.startswith("bytes") and isinstance(value, (int, float)):
        return human_bytes(int(value))
    if name.endswith("seconds") or name.endswith("seconds_saved"):
        return _duration(float(value))
    return str(value)


def _store(cache_dir: Path | None, allow_shared_root: bool, *, looking: bool = False):
    """The local store (no --remote on these commands). ``looking``: a command that
    only reads or tidies says when the root it was given did not exist, which is
    mostly a typo in --cache-dir or ACACHE_DIR, before opening makes it."""
    made = looking and cache_dir is not None and not Path(cache_dir).expanduser().exists()
    store = open_store(cache_dir, allow_shared_root)  # a root it cannot make: one line
    if made:
        err_console.print(
            f"note: {shown(cache_dir)} did not exist: an empty cache was made there "
            "(a typo in --cache-dir or ACACHE_DIR?)",
            highlight=False,
            soft_wrap=True,  # one line, however narrow the terminal
        )
    return store


def _verify_status(r: Any) -> str:
    return "ok" if r.ok else "QUARANTINED" if r.quarantined else "ERROR"


def _warn(warnings: list[str]) -> None:
    for w in warnings:
        # One line each, however long: rich would wrap it at the terminal's width.
        err_console.print(f"warning: {visible(w)}", highlight=False, markup=False, soft_wrap=True)


# Labels, recipe names and paths are the user's text: render.print_table shows them as data.
_table = print_table


Keys = Annotated[list[str], typer.Argument(help="Keys or unique prefixes (>= 8 hex chars).")]


def register(app: typer.Typer) -> None:
    @app.command("ls")
    def ls(
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
        remote: RemoteFlag = False,
        remote_url: RemoteUrl = None,
    ):
        """List cached entries, most recently used first."""
        if remote:
            return ls_remote(remote_url, json)
        store = _store(cache_dir, allow_shared_root, looking=True)
        entries, warnings = store.ls()
        entries.sort(key=lambda e: e.last_used, reverse=True)
        _warn(warnings)
        if json:
            # One entry per line through json's C encoder: emit_json's indent=2 goes
            # through the pure-Python encoder, seconds for 10,000 entries.
            lines = [dumps(e.summary(), sort_keys=True) for e in entries]
            sys.stdout.write("[\n" + ",\n".join(lines) + ("\n]\n" if lines else "]\n"))
            return
        # The build choices that tell apart entries of one recipe and backend; an entry
        # whose label predates a field shows "-".
        shown = ("recipe", "backend", "device", "dtype", "mode", "max_seq_len", "max_batch")
        rows = [
            [
                e.key[:12],
                *(str(e.label.get(k) if e.label.get(k) is not None else "-") for k in shown),
                human_bytes(e.size),
                _ago(e.last_used),
                f"{e.build_seconds:.1f}s",
            ]
            for e in entries
        ]
        cols = ["key", "recipe", "backend", "device", "dtype", "mode", "context", "rows"]
        cols += ["size", "last used", "build"]
        # Narrow terminals drop the columns a user needs least, so a key stays whole.
        _table(f"{n_entries(len(entries))} in {store.base}", cols, rows,
               whole=("key", "backend", "dtype", "size", "last used"),
               optional=("build", "mode", "device", "context", "dtype", "rows"))  # fmt: skip

    @app.command("show")
    def show(
        key: Annotated[str, typer.Argument(help="Key or unique prefix (>= 8 hex chars).")],
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Show an entry's manifest: label, files, factors (not verified; see `verify`)."""
        from ..keys import flatten

        check_prefixes([key])
        e = _store(cache_dir, allow_shared_root).peek(key)
        if json:
            emit_json({**e.summary(), "manifest": e.manifest})
            return
        from ..store.provenance import describe

        fields = {**e.summary(), "provenance": describe(e.provenance)}
        rows = [[k, _shown_field(k, v)] for k, v in fields.items()]
        _table(f"entry {e.key}", ["field", "value"], rows)
        _table(
            "files",
            ["path", "size", "digest"],
            [[r, human_bytes(i["size"]), i["digest"]] for r, i in sorted(e.files.items())],
        )
        _table("factors", ["factor", "value"], flatten(e.factors))

    @app.command("verify")
    def verify(
        keys: Annotated[
            list[str] | None, typer.Argument(help="Keys or prefixes (default: all).")
        ] = None,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Re-hash every file of the entries; quarantine any that fail."""
        check_prefixes(keys or [])
        store = _store(cache_dir, allow_shared_root, looking=True)
        warnings: list[str] = []
        with _progress("verifying", entries=True) as cb:
            results = store.verify(keys or None, progress=cb, warnings=warnings)
        _warn(warnings)
        if json:
            emit_json([r.__dict__ for r in results])
        else:
            rows = [[r.key[:12], _verify_status(r), r.problem or ""] for r in results]
            _table(f"verified {n_entries(len(results))}", ["key", "status", "problem"], rows)
        if bad := [r for r in results if r.quarantined]:
            raise IntegrityError(
                f"{len(bad)} of {len(results)} entries failed verification and were quarantined "
                f"(first: {bad[0].key[:12]}: {bad[0].problem}); rebuild them"
            )
        if unread := [r for r in results if not r.ok]:
            raise FilesystemError(
                f"{len(unread)} of {len(results)} entries could not be verified and were left "
                f"in place (first: {unread[0].key[:12]}: {unread[0].problem})"
            )

    @app.command("rm")
    def rm(
        keys: Keys,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Delete entries (not one another process is loading, nor one others depend on)."""
        check_prefixes(keys)
        store = _store(cache_dir, allow_shared_root)
        full = list(dict.fromkeys(store.resolve(k) for k in keys))  # all must exist first
        freed = store.remove(full)
        if json:
            emit_json({"removed": full, "freed": freed})
            return
        console.print(f"removed {n_entries(len(full))}, freed {human_bytes(freed)}")

    @app.command("gc")
    def gc(
        max_size: Annotated[
            str | None, typer.Option(help="Evict LRU entries until the cache fits, e.g. 10G.")
        ] = None,
        older_than: Annotated[
            str | None, typer.Option(help="Evict entries unused for this long, e.g. 7d.")
        ] = None,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Show what would go; delete nothing.")
        ] = False,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Evict least-recently-used entries (never one being loaded, nor a needed dependency)."""
        if max_size is None and older_than is None:
            raise ArgumentError("gc needs --max-size and/or --older-than, e.g. gc --max-size 10G")
        size = parse_size(max_size) if max_size is not None else None
        age = parse_duration(older_than) if older_than is not None else None
        store = _store(cache_dir, allow_shared_root)
        warnings: list[str] = []
        plan = store.gc_plan(max_size=size, older_than=age, warnings=warnings)
        _warn(warnings)  # entries the scan skipped are never evicted by gc
        done = None if dry_run else store.execute(plan)
        evicted = [e for e in plan.entries if done is None or e.key in done.evicted]
        if done is not None:
            _warn([f"skipped {key[:12]}: another process is loading it" for key in done.in_use])
        if json:
            emit_json(
                {
                    "dry_run": dry_run,
                    "bytes": plan.bytes,
                    "freed": done.freed if done else 0,
                    "total_bytes": plan.total_bytes,
                    "entries": [e.summary() for e in evicted],
                    "in_use": done.in_use if done else [],
                    "kept": done.kept if done else [],
                }
            )
            return
        verb = "would evict" if dry_run else "evicted"
        rows = [
            [e.key[:12], e.label.get("recipe", "-"), human_bytes(e.size), _ago(e.last_used)]
            for e in evicted
        ]
        nbytes = plan.bytes if done is None else done.freed
        _table(
            f"{verb} {n_entries(len(evicted))} ({human_bytes(nbytes)})",
            ["key", "recipe", "size", "last used"],
            rows,
        )

    @app.command("prune")
    def prune(
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Show what would go; remove nothing.")
        ] = False,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Remove leftovers of dead builds, stale locks and quarantined entries."""
        res = _store(cache_dir, allow_shared_root, looking=True).prune(dry_run=dry_run)
        _warn(res.warnings)
        if json:
            emit_json(res.__dict__)
            return
        verb, freed = ("would prune", "would free") if dry_run else ("pruned", "freed")
        console.print(
            f"{verb} {res.staging} staging dirs, {res.locks} locks, {res.quarantine} "
            f"quarantined, {res.other} stale files; {freed} {human_bytes(res.bytes)}"
        )
        if res.quarantine and dry_run:
            console.print("quarantined entries are in quarantine/ under the cache root: "
                          "look before they go", highlight=False)  # fmt: skip

    @app.command("stats")
    def stats(
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Hits, misses, builds, bytes, and build seconds saved."""
        warnings: list[str] = []
        s = _store(cache_dir, allow_shared_root, looking=True).stats(warnings=warnings)
        _warn(warnings)
        if json:
            emit_json(s)
            return
        # Words and units for a person; --json keeps the raw numbers.
        rows = [[STAT_LABELS.get(k, k.replace("_", " ")), _stat_value(k, v)] for k, v in s.items()]
        _table("cache stats", ["stat", "value"], rows)

    @app.command("export")
    def export(
        keys: Keys,
        out: Annotated[Path, typer.Option("-o", "--output", help="Bundle file (.tar) to write.")],
        force: Annotated[
            bool,
            typer.Option(
                "--force",
                help="Replace an existing regular file at --output; never a symlink, "
                "directory or device.",
            ),
        ] = False,
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Write entries (verified first) to a tar bundle; an existing file needs --force."""
        from ..store.bundle import check_export_target
        from ..store.bundle import export as do_export

        check_prefixes(keys)
        check_export_target(out, overwrite=force)  # before the store is opened
        store = _store(cache_dir, allow_shared_root)
        with _progress("exporting") as cb:
            done = do_export(store, keys, out, progress=cb, overwrite=force)
        if json:
            emit_json({"exported": list(done), "path": str(out), "bytes": out.stat().st_size})
            return
        console.print(f"exported {n_entries(len(done))} to {shown(out)}")

    @app.command("import")
    def import_(
        file: Annotated[Path, typer.Argument(help="A bundle written by `acache export`.")],
        cache_dir: CacheDir = None,
        allow_shared_root: AllowSharedRoot = False,
        json: JsonOut = False,
    ):
        """Verify and add a bundle's entries to the cache."""
        from ..store.bundle import import_bundle

        if not file.is_file():
            raise BundleError(f"bundle {file} does not exist or is not a file")
        store = _store(cache_dir, allow_shared_root)
        with _progress("importing") as cb:
            done = import_bundle(store, file, progress=cb)
        if json:
            emit_json({"imported": done.imported, "already_present": done.present})
            return
        line = f"imported {n_entries(len(done.imported))}"
        if done.imported:
            line += f": {', '.join(k[:12] for k in done.imported)}"
        if done.present:
            line += f"; {len(done.present)} already present: "
            line += ", ".join(k[:12] for k in done.present)
        console.print(line)
