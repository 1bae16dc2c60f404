"""`acache run` (cli/run.py) through the real Typer app: one prompt, a batch, text and ids.

Bad input to `run` shares the CLI's table in tests/test_cli_build.py; a checkpoint
folder's tokenizer and EOS ids: tests/test_generate_checkpoint.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _generate_util import byte_level_tokenizer, make_checkpoint, write_config
from test_cli_build import assert_user_error, run

from artifactcache.cli.run import batch_header, generate_batch_and_print
from artifactcache.recipes import BUILTIN_DIR, load_recipe

NEW = "4"


def _entries(root: Path) -> list[Path]:
    return list(root.rglob("manifest.json"))


def test_run_prints_ids(cache_dir: Path):
    r = run("run", "tiny-llama", "--tokens", "1,15043,29892", "--max-new-tokens", "5")
    assert r.exit_code == 0, r.stderr
    ids = [int(t) for t in r.stdout.split()]
    assert len(ids) == 5 and all(0 <= i < 32000 for i in ids)
    # The recipe's own prompt text needs no tokenizer: its ids are in the recipe.
    j = json.loads(
        run("run", "tiny-llama", "--prompt", "Hello, my name is", "-b", "eager", "--json").stdout
    )
    recipe = load_recipe("tiny-llama")
    assert j["prompt_ids"] == list(recipe.bench.prompt_ids)
    assert len(j["new_ids"]) == recipe.shapes.max_seq_len - len(j["prompt_ids"])
    assert j["status"] == "hit"  # the first run built the entry
    # A hit built nothing: the entry's seconds are its lookup, named for what they cover
    # (and under their old name, build_seconds, for one release).
    assert j["entry_seconds"] == j["build_seconds"] >= 0 and j["load_seconds"] >= 0
    # Same input, same output: greedy and deterministic.
    again = run("run", "tiny-llama", "--tokens", "1 15043 29892", "--max-new-tokens", "5")
    assert again.stdout == r.stdout


def _alone(*args: str) -> dict:
    r = run("run", "tiny-llama", "-b", "eager", "--new-tokens", NEW, "--json", *args)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_a_batch_of_token_prompts_gives_each_prompts_lone_tokens(cache_dir: Path):
    prompts = ["1,15043,29892", "5,6", "7,8,9,10,11"]
    given = [a for p in prompts for a in ("--tokens", p)]
    r = run("run", "tiny-llama", "-b", "eager", "--new-tokens", NEW, "--json", *given)
    assert r.exit_code == 0, r.stderr
    batch = json.loads(r.stdout)
    # The recipe has one row: the run built the artifact of three and said so.
    assert r.stderr.splitlines()[0] == "3 prompts: the artifact for --max-batch 3"
    assert batch["status"] == "built" and "new_ids" not in batch
    lone = [_alone("--tokens", p) for p in prompts]
    assert [row["prompt_ids"] for row in batch["rows"]] == [x["prompt_ids"] for x in lone]
    # Left-padded to the longest prompt, each row generates what it does alone.
    assert [row["new_ids"] for row in batch["rows"]] == [x["new_ids"] for x in lone]
    assert all(row["stop"] == "length" and row["text"] is None for row in batch["rows"])
    # The key is the one `--max-batch 3` names, and a second run hits it.
    key = run("key", "tiny-llama", "-b", "eager", "--max-batch", "3").stdout.split()[0]
    assert batch["key"] == key != lone[0]["key"]
    plain = run("run", "tiny-llama", "-b", "eager", "--new-tokens", NEW, *given)
    assert plain.exit_code == 0, plain.stderr
    assert " hit " in plain.stderr.splitlines()[-1]
    expected = []
    for i, x in enumerate(lone):
        expected += [batch_header(i, 3), " ".join(map(str, x["new_ids"]))]
    assert plain.stdout.splitlines() == expected


def test_a_batch_runs_on_a_bigger_artifact_asked_for_and_samples_row_i_with_seed_plus_i(
    cache_dir: Path,
):
    sampling = ["--temperature", "1.0", "--sample-seed", "11"]
    args = ["--max-batch", "4", "--tokens", "1,2,3", "--tokens", "4,5", *sampling]
    r = run("run", "tiny-llama", "-b", "eager", "--new-tokens", NEW, "--json", *args)
    assert r.exit_code == 0, r.stderr
    assert "prompts: the artifact" not in r.stderr  # asked for: nothing to say
    batch = json.loads(r.stdout)
    key4 = run("key", "tiny-llama", "-b", "eager", "--max-batch", "4").stdout.split()[0]
    assert batch["key"] == key4
    first = _alone("--tokens", "1,2,3", "--temperature", "1.0", "--sample-seed", "11")
    second = _alone("--tokens", "4,5", "--temperature", "1.0", "--sample-seed", "12")
    assert [row["new_ids"] for row in batch["rows"]] == [first["new_ids"], second["new_ids"]]


def test_a_batch_that_does_not_fit_fails_in_one_line_before_any_build(cache_dir: Path):
    two = ["--tokens", "1,2", "--tokens", "3"]
    assert_user_error(run("run", "tiny-llama", "--max-batch", "1", *two),
                      "2 prompts do not fit --max-batch 1: pass --max-batch 2")  # fmt: skip
    assert_user_error(run("run", "tiny-llama", "--tokens", "1", "--prompt", "hi"), "not both")
    # The longest prompt sets the batch's length: it must fit with the new tokens.
    long = ",".join(["1"] * 60)
    assert_user_error(run("run", "tiny-llama", "--tokens", "1", "--tokens", long,
                          "--new-tokens", "10"), "max_seq_len")  # fmt: skip
    assert_user_error(run("run", "tiny-llama", "--tokens", "1", "--tokens", "99999"),
                      "vocabulary")  # fmt: skip
    assert _entries(cache_dir) == []


def test_a_batch_of_text_prompts_prints_each_continuation(tmp_path: Path, cache_dir: Path):
    from tokenizers import Tokenizer

    _, folder = make_checkpoint(tmp_path)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    write_config(folder, tok.get_vocab_size(), eos=None)
    texts = ["hello my name is", "the cat sat on a mat while we talk"]
    base = ["run", str(folder), "-b", "eager", "--new-tokens", NEW]
    lone = []
    for t in texts:
        r = run(*base, "--prompt", t, "--json")
        assert r.exit_code == 0, r.stderr
        lone.append(json.loads(r.stdout))
    r = run(*base, "--prompt", texts[0], "--prompt", texts[1])
    assert r.exit_code == 0, r.stderr
    expected = []
    for i, x in enumerate(lone):
        expected += [batch_header(i, 2), x["text"]]
    assert r.stdout == "\n".join(expected) + "\n"
    assert all(x["text"].strip() for x in lone)


def test_the_status_line_says_a_build_took_time_and_counts_tokens_as_words(cache_dir: Path):
    first = run("run", "tiny-llama", "-b", "eager", "--tokens", "1,2", "--new-tokens", "1")
    assert first.exit_code == 0, first.stderr
    line = first.stderr.splitlines()[-1]
    assert re.search(r"  built in \d+\.\d s  load ", line) and " 1 token in " in line
    again = run("run", "tiny-llama", "-b", "eager", "--tokens", "1,2", "--new-tokens", "2")
    assert "  hit  load " in again.stderr and " 2 tokens in " in again.stderr


def test_batch_header_reads_as_documented():
    assert batch_header(0, 3) == "--- prompt 1 of 3 ---"  # README names this line


@pytest.mark.parametrize(
    "flags", [["--max-seq-len", "100", "--max-batch", "64"], ["--max-seq-len", "100"]]
)
def test_run_builds_the_key_build_and_key_name_with_the_same_flags(tmp_path, cache_dir, flags):
    """A recipe that writes its prefill_len: run must not take the shapes in two steps,
    which derive another prefill_len than `build` and `key` do (one step)."""
    text = (BUILTIN_DIR / "tiny-llama.toml").read_text()
    text = text.replace("max_seq_len = 64", "max_seq_len = 256")
    text = text.replace("prefill_len = 8", "prefill_len = 200")
    recipe = tmp_path / "written.toml"
    recipe.write_text(text)
    r = run("run", recipe, "-b", "eager", "--tokens", "1,2", "--new-tokens", "2", "--json", *flags)
    assert r.exit_code == 0, r.stderr
    key = run("key", recipe, "-b", "eager", *flags).stdout.split()[0]
    assert json.loads(r.stdout)["key"] == key


class _Tty:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> None:
        self.writes.append(s)


class _Rows:
    """Hands back fixed ids for every prompt: the printing, apart from any model."""

    def __init__(self, new: list[int]) -> None:
        self.new = new

    def generate_batch(self, prompts, n, **_):
        return [self.new[:n] for _ in prompts]


def test_a_batch_on_a_terminal_gets_control_characters_escaped():
    tok = byte_level_tokenizer()
    new = tok.encode(" \x1b[2J").ids
    out = _Tty()
    rows = generate_batch_and_print(_Rows(new), [[1], [1, 1]], 9, {}, tok, out, show=True)
    assert [text for _, text in rows] == [" \x1b[2J", " \x1b[2J"]  # the text itself: exact
    printed = "".join(out.writes)
    assert "\x1b" not in printed and printed.count("\\x1b[2J") == 2
    rows = generate_batch_and_print(_Rows([7, 8]), [[1]], 9, {}, None, out, show=True)
    assert rows == [([7, 8], None)] and out.writes[-1].endswith("\n7 8\n")  # no tokenizer: ids
