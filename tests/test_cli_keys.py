"""`acache key` and `acache diff` (cli/keys.py): `key --diff` against a cached entry.

Keys and their factors themselves: tests/test_keys.py; `diff` of two entries:
tests/test_cli_cache.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_cli_build import assert_user_error, run


def _key(*args: str) -> str:
    r = run("key", "tiny-llama", "-b", "eager", *args)
    assert r.exit_code == 0, r.stderr
    return r.stdout.split()[0]


def test_key_diff_names_what_parts_these_arguments_from_a_cached_entry(cache_dir: Path):
    built = json.loads(run("build", "tiny-llama", "-b", "eager", "--json").stdout)["key"]
    r = run("key", "tiny-llama", "-b", "eager", "--max-seq-len", "32", "--diff", built[:10],
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    found = json.loads(r.stdout)
    assert found["entry"] == built and found["key"] == _key("--max-seq-len", "32") != built
    assert found["differ"] == [{"factor": "recipe.shapes.max_seq_len", "a": 64, "b": 32}]
    plain = run("key", "tiny-llama", "-b", "eager", "--max-seq-len", "32", "--diff", built[:10])
    assert "1 factor differs" in plain.stdout and "recipe.shapes.max_seq_len" in plain.stdout
    same = run("key", "tiny-llama", "-b", "eager", "--diff", built[:10])
    assert "have identical factors" in same.stdout


def test_key_diff_with_no_such_entry_is_one_line(cache_dir: Path):
    assert_user_error(run("key", "tiny-llama", "-b", "eager", "--diff", "12345678"),
                      "no entry matches")  # fmt: skip
    assert_user_error(run("key", "tiny-llama", "-b", "eager", "--diff", "zz"), "not a key prefix")
