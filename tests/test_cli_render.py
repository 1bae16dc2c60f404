"""How the CLI prints (artifactcache/cli/render.py)."""

from __future__ import annotations

from artifactcache.cli import render


def test_tables_follow_the_width_in_effect_when_they_print(monkeypatch, capsys):
    """A console made while COLUMNS said 60 (as pytest-xdist's workers import the app
    under COLUMNS=80) prints at the width COLUMNS gives later: a long cell stays on one
    line at 250 columns and folds, never crops, at 40; its markup and control
    characters are shown as text."""
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setattr(render, "console", type(render.console)())
    long = "backend.options.codegen.inductor_config.aot_inductor.package_constants_in_so"
    rows = [[long, "[bold]x[/bold]\x1b[2J"]]
    monkeypatch.setenv("COLUMNS", "250")
    render.print_table(None, ["factor", "value"], rows)
    out = capsys.readouterr().out
    assert long in out and "[bold]x[/bold]\\x1b[2J" in out and "\x1b" not in out
    monkeypatch.setenv("COLUMNS", "40")
    render.print_table(None, ["factor", "value"], rows)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 40
    assert "".join(line.split("│")[1].strip() for line in lines[3:-1]) == long


def test_a_narrow_terminal_drops_optional_columns_and_keeps_whole_ones(monkeypatch, capsys):
    """`acache ls` on 80 columns: the key prefix stays on one line, copyable; the
    columns a user needs least go first; piped, every column is printed."""
    monkeypatch.setattr(render, "console", type(render.console)())
    cols = ["key", "recipe", "backend", "device", "dtype", "mode", "build"]
    rows = [["35e89209ec74", "a-long-recipe-name", "onnx-export", "cuda", "bf16",
             "reduce-overhead", "132.2s"]] * 3  # fmt: skip
    kw = {"whole": ("key", "backend"), "optional": ("build", "mode", "device")}
    monkeypatch.setenv("COLUMNS", "60")
    render.print_table(None, cols, rows, **kw)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 60
    assert "35e89209ec74" in out and "onnx-export" in out
    assert "reduce-overhead" not in out and "132.2s" not in out
    monkeypatch.setenv("COLUMNS", "70")  # room for one more: device, left out last, stays
    render.print_table(None, cols, rows, **kw)
    out = capsys.readouterr().out
    assert "cuda" in out and "reduce-overhead" not in out and "132.2s" not in out
    monkeypatch.setenv("COLUMNS", "250")
    render.print_table(None, cols, rows, **kw)
    wide = capsys.readouterr().out
    assert "reduce-overhead" in wide and "132.2s" in wide and "cuda" in wide
    monkeypatch.delenv("COLUMNS")  # piped: the whole table
    render.print_table(None, cols, rows, **kw)
    assert "reduce-overhead" in capsys.readouterr().out
