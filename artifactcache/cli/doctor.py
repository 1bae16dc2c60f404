"""`acache doctor [--json] [--full]`: what works on this machine, and why not.

The report and its memo live in artifactcache/doctor.py; this renders it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..doctor import doctor_report
from .app import CacheDir, JsonOut, Remote
from .render import console, emit_json, human_bytes, n_entries, print_table, shown


def _default(value: Any) -> str:
    return "(default)" if value is None else f"(default: {value})"


def _render(rep: dict[str, Any]) -> None:
    t = rep["torch"]
    if rep["probed"]["from_memo"]:
        console.print(
            f"[dim]toolchain checks from {rep['probed']['at']}, kept for this toolchain "
            "(--full: check again)[/dim]",
            highlight=False,
        )
    elif not rep["probed"]["full"]:
        console.print(
            "[dim]quick checks: what is installed, and the GPUs as the driver lists them "
            "(no torch import, no C++ compiler probe); `acache doctor --full` runs the full "
            "checks and keeps them in the cache[/dim]",
            highlight=False,
        )
    console.print(
        f"python {rep['python']}  torch {t['version']}  CUDA {t['cuda'] or '-'}  "
        f"driver {rep['driver'] or '-'}",
        highlight=False,
    )
    for g in rep["gpus"] or [{"index": "-", "name": "no CUDA GPU", "compute_capability": "-"}]:
        console.print(f"gpu {g['index']}: {g['name']} (sm {g['compute_capability']})")
    # print_table: "[trt]" in an install hint is text, not rich markup; long cells fold
    rows = [
        [
            b["name"],
            "yes" if b["available"] else "no",
            b["reason"] if b["available"] is False else "",
        ]
        for b in rep["backends"]
    ]
    print_table(None, ["backend", "available", "reason / install"], rows)
    cc = rep["compiler"]
    chosen = (
        f"{cc['chosen']} {cc['version'] or ''}".strip() if cc["chosen"] else "Inductor's default"
    )
    if not cc.get("checked", True) and cc["chosen"]:
        chosen += " (not probed yet: --full, or the first aoti build, checks its code runs here)"
    console.print(
        f"c++ for aoti/inductor: {chosen}"
        + (f"  (passed over: {'; '.join(cc['passed_over'])})" if cc["passed_over"] else ""),
        highlight=False,
    )
    c = rep["cache"]
    console.print(
        f"cache {shown(c['dir'])}  {human_bytes(c['size_bytes'])}  {n_entries(c['entries'])}  "
        f"mode {c['mode'] or '-'}" + (f"  ({shown(c['problem'])})" if c["problem"] else ""),
        highlight=False,
    )
    for item in c["stray"]:
        console.print(f"warning: stray item {shown(item)} in the cache; remove it", highlight=False)
    r = rep["remote"]
    if not r["configured"]:
        console.print("remote: not configured (--remote / ACACHE_REMOTE)")
    else:
        state = r.get("error") or ", ".join(
            k for k in ("reachable", "readable", "writable") if r.get(k)
        )
        console.print(f"remote {shown(r['url'])}: {shown(state)}", highlight=False)
    if rep["bytecode"]["problem"]:
        console.print(f"warning: {rep['bytecode']['problem']}", highlight=False)
    rows = [
        [
            s["name"],
            s["value"] if s["value"] is not None else _default(s["default"]),
            f"refused: {s['problem']}" if s["problem"] else s["doc"],
        ]
        for s in rep["settings"]
    ]
    print_table(None, ["setting", "value", "what it does"], rows)


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        json_out: JsonOut = False,
        cache_dir: CacheDir = None,
        remote: Remote = None,
        full: Annotated[
            bool,
            typer.Option(
                "--full",
                help="The full checks: import torch, ask each backend, probe the C++ "
                "compiler (seconds; kept in the cache for this toolchain), even when the "
                "cache holds them already",
            ),
        ] = False,
    ) -> None:
        """What works here: versions, GPUs, each backend (and why not), cache, remote, settings.

        The settings are the ACACHE_* variables in effect. Quick by default (what is
        installed, no torch import); --full checks for real and keeps the result in the
        cache, reused until a version, the driver, $CXX or $PATH changes."""
        rep = doctor_report(cache_dir, remote, full=full)
        if json_out:
            emit_json(rep)
        else:
            _render(rep)
