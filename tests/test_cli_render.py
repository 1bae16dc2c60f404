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
