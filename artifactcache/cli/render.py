"""How the CLI prints: consoles, tables and JSON, with user data always shown inert."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


class LiveConsole(Console):
    """A rich Console whose width is measured at each print, never frozen.

    rich fixes the width when a Console is made if $COLUMNS is set then; these are
    made at import, so a COLUMNS set later (pytest-xdist sets 80 in its workers, a test
    or an embedding program sets another) would be ignored, and a long table cell
    folded to the stale width. Each print reads the terminal and $COLUMNS anew.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if kwargs.get("width") is None:
            self._width = None
        if kwargs.get("height") is None:
            self._height = None

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Plain lines piped or redirected, with no width asked, are never wrapped at rich's
        default of 80 columns: a key and its status stay on one line for grep and cut."""
        if (
            "soft_wrap" not in kwargs
            and all(isinstance(o, str) for o in objects)
            and not self.is_terminal
            and not os.environ.get("COLUMNS", "").strip()
        ):
            kwargs["soft_wrap"] = True
        super().print(*objects, **kwargs)

    def print_at_width(self, renderable: Any, width: int) -> None:
        """Print at ``width`` columns (rich's print(width=) never exceeds the console's),
        then measure anew at the next print."""
        self.width = width
        try:
            self.print(renderable)
        finally:
            self._width = None


console = LiveConsole()
err_console = LiveConsole(stderr=True)

# C0/C1 control characters, DEL, and the bidi overrides that reorder what a terminal shows.
_INVISIBLE = [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_VISIBLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _INVISIBLE}


def visible(value: object) -> str:
    """User data (names, labels, paths, remote text) as inert text: every control
    character written as its escape, so nothing reaches the terminal as a command."""
    return str(value).translate(_VISIBLE)


_TEXT_VISIBLE = {c: e for c, e in _VISIBLE.items() if chr(c) not in "\n\t"}


def terminal_text(text: str) -> str:
    """Generated text for a terminal: lines and tabs kept, every other control character
    written as its escape, so a model's output cannot drive the terminal (an ESC
    sequence, a backspace). Piped, the text goes out exactly as generated."""
    return text.translate(_TEXT_VISIBLE)


def shown(value: object) -> str:
    """``visible(value)`` with rich markup escaped, for user data inside a markup string."""
    return escape(visible(value))


def cell(value: object) -> Text:
    """A table cell or title from user data: plain Text, never parsed as markup."""
    return Text(visible(value))


# rich lays out every cell of a table (about 2 ms a row here): past this many
# rows, print plain aligned columns instead, so `ls` of 10,000 entries stays fast.
RICH_MAX_ROWS = 200


def print_table(
    title: str | None,
    cols: list[str],
    rows: list[list[Any]],
    *,
    whole: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
) -> None:
    """The one way a command prints a table: every cell is data (see ``visible``).

    On a terminal too narrow for the whole table, the ``optional`` columns are left
    out, in that order, until it fits; the columns named in ``whole`` are never folded
    (a key prefix is what the user copies into the next command), the others fold.
    """
    cells = [[visible(x) for x in r] for r in rows]
    if len(rows) > RICH_MAX_ROWS:
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
        lines = [visible(title)] if title else []
        for r in [cols, ["-" * w for w in widths], *cells]:
            lines.append("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip())
        sys.stdout.write("\n".join(lines) + "\n")
        return
    keep = list(range(len(cols)))
    t = _rich_table(title, cols, cells, keep, whole)
    for name in optional:
        if not _too_wide(t):
            break
        keep.remove(cols.index(name))
        t = _rich_table(title, cols, cells, keep, whole)
    print_wide(t)


def _rich_table(
    title: str | None, cols: list[str], cells: list[list[str]], keep: list[int],
    whole: tuple[str, ...],
) -> Table:  # fmt: skip
    t = Table(title=cell(title) if title else None, show_lines=False)
    for i in keep:
        if cols[i] in whole:
            t.add_column(cell(cols[i]), no_wrap=True)
        else:
            t.add_column(cell(cols[i]), overflow="fold")
    for r in cells:
        t.add_row(*(Text(r[i]) for i in keep))
    return t


def _too_wide(table: Table) -> bool:
    """Whether ``table`` would fold on this terminal (never piped: that prints it whole)."""
    if not (console.is_terminal or os.environ.get("COLUMNS", "").strip()):
        return False
    natural = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
    return natural > console.width


def print_wide(table: Table) -> None:
    """Print a rich table at a terminal's width, or the one COLUMNS asks for; piped or
    redirected with no width asked, at the table's whole width, never folded at rich's
    default of 80 columns."""
    if console.is_terminal or os.environ.get("COLUMNS", "").strip():
        console.print(table)
        return
    natural = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
    console.print_at_width(table, max(console.width, natural))


def emit_json(obj: Any) -> None:
    """JSON to stdout, never through rich (which would wrap long lines)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def n_entries(n: int) -> str:
    """``n`` with "entry" or "entries", as it reads."""
    return f"{n} entry" if n == 1 else f"{n} entries"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# Not a terminal (a CI log, a pipe): a plain line once the work has run this long, and
# its time when done, so a hit stays quiet and a minutes-long build says what it does.
PLAIN_PROGRESS_AFTER_S = 1.0


@contextlib.contextmanager
def progress(text: str) -> Iterator[None]:
    """A spinner on stderr while something slow runs when a person watches; else plain
    progress lines (PLAIN_PROGRESS_AFTER_S)."""
    if sys.stderr.isatty():
        with err_console.status(text):
            yield
        return
    t0 = time.perf_counter()
    said = threading.Event()

    def say() -> None:
        said.set()
        err_console.print(f"{shown(text)} ...", highlight=False)

    timer = threading.Timer(PLAIN_PROGRESS_AFTER_S, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
    if said.is_set():  # done: on an error its one line is the last word
        err_console.print(f"{shown(text)}: {time.perf_counter() - t0:.1f} s", highlight=False)
