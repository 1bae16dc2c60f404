"""A checkpoint folder's EOS ids and tokenizer: in Python, in `acache run`, in bench's prompt.

Reading the files themselves: tests/test_sources_checkpoint_generation.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _generate_util import byte_level_tokenizer, make_checkpoint, write_config
from typer.testing import CliRunner

from artifactcache import api
from artifactcache.cli.app import app
from artifactcache.cli.run import generate_and_print
from artifactcache.generate.checkpoint import TextStream, decode_continuation
from artifactcache.measure.child.timing import measure_requests

PROMPT = "hello my name is"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    return d


def _run(cache: Path, *args: str):
    return CliRunner().invoke(app, ["run", *args, "--cache-dir", str(cache)])


def _one_error_line(result, contains: str) -> None:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and contains in lines[0], lines


def test_the_runner_has_the_folders_tokenizer_and_stops_at_its_eos(tmp_path: Path, cache: Path):
    recipe, folder = make_checkpoint(tmp_path)
    runner = api.load(str(recipe), "eager", weights=folder, cache_dir=cache)
    tok = runner.tokenizer
    assert tok is not None and tok.encode(PROMPT).tokens == ["<s>", *PROMPT.split()]
    assert runner.eos_token_ids == ()  # this folder has no generation_config.json
    ids = tok.encode(PROMPT).ids
    free = runner.generate(ids, 20)
    k = next(i for i in range(2, 20) if free[i] not in free[:i])
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": free[k]}))
    with_eos = api.load(str(recipe), "eager", weights=folder, cache_dir=cache)
    assert with_eos.eos_token_ids == (free[k],)
    assert with_eos.generate(ids, 20) == free[: k + 1]  # the EOS id is kept, as transformers does
    assert with_eos.generate(ids, 20, eos_token_ids=()) == free
    # The seed benchmark never stops early, whatever the checkpoint's EOS.
    stats = measure_requests(with_eos, [ids], 20, iters=1, warmup=1, device=torch.device("cpu"))
    assert stats["new_tokens"] == 20
    assert api.load(str(recipe), "eager", cache_dir=cache).tokenizer is None  # no folder


def test_run_prompt_round_trips_text_and_json_has_ids_and_text(tmp_path: Path, cache: Path):
    from tokenizers import Tokenizer

    recipe, folder = make_checkpoint(tmp_path)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    args = [str(recipe), "--weights", str(folder), "--prompt", PROMPT, "--max-new-tokens", "12"]
    j = json.loads(_run(cache, *args, "--json").stdout)
    assert j["prompt_ids"] == tok.encode(PROMPT).ids
    assert tok.decode(j["prompt_ids"], skip_special_tokens=True) == PROMPT
    assert len(j["new_ids"]) == 12 and j["stop"] == "length"
    assert j["text"] == decode_continuation(tok, j["prompt_ids"], j["new_ids"])
    assert j["text"].split() == tok.decode(j["new_ids"], skip_special_tokens=True).split()
    plain = _run(cache, *args)  # CliRunner's stdout is no terminal: the text at the end
    assert plain.exit_code == 0, plain.output
    assert plain.stdout == j["text"] + "\n"
    # An EOS id from the command line stops the text there.
    eos = j["new_ids"][0]
    stopped = json.loads(_run(cache, *args, "--json", "--eos-id", str(eos)).stdout)
    assert stopped["new_ids"] == [eos] and stopped["stop"] == "eos"


def test_run_on_a_checkpoint_folder_prints_text_and_stops_at_its_eos(tmp_path: Path, cache: Path):
    """The folder alone is the recipe: config.json, weights, tokenizer.json, EOS ids."""
    from tokenizers import Tokenizer

    _, folder = make_checkpoint(tmp_path)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    write_config(folder, tok.get_vocab_size(), eos=tok.token_to_id("</s>"))
    base = [str(folder), "--prompt", PROMPT, "--max-new-tokens", "30"]
    free = json.loads(_run(cache, *base, "--json", "--no-eos").stdout)
    assert free["prompt_ids"] == tok.encode(PROMPT).ids and len(free["new_ids"]) == 30
    k = next(i for i in range(1, 30) if free["new_ids"][i] not in free["new_ids"][:i])
    eos = free["new_ids"][k]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    stopped = json.loads(_run(cache, *base, "--json").stdout)  # generation_config wins
    assert stopped["new_ids"] == free["new_ids"][: k + 1] and stopped["stop"] == "eos"
    text = _run(cache, *base)
    assert text.exit_code == 0, text.output
    assert text.stdout == stopped["text"] + "\n" and stopped["text"].strip()


class _Out:
    def __init__(self, tty: bool) -> None:
        self.tty, self.writes, self.flushes = tty, [], 0

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> None:
        self.writes.append(s)

    def flush(self) -> None:
        self.flushes += 1


def test_text_streams_token_by_token_only_to_a_terminal(tmp_path: Path, cache: Path):
    recipe, folder = make_checkpoint(tmp_path)
    runner = api.load(str(recipe), "eager", weights=folder, cache_dir=cache)
    ids = runner.tokenizer.encode(PROMPT).ids
    choices = {"eos_token_ids": (), "temperature": 1.0, "seed": 4}
    tty, pipe = _Out(True), _Out(False)
    new_t, text_t = generate_and_print(runner, ids, 10, choices, runner.tokenizer, tty, show=True)
    new_p, text_p = generate_and_print(runner, ids, 10, choices, runner.tokenizer, pipe, show=True)
    assert new_t == new_p and text_t == text_p
    assert tty.flushes == 10 and len(tty.writes) == 11 and "".join(tty.writes) == text_t + "\n"
    assert pipe.writes == [text_p + "\n"] and pipe.flushes == 0


def test_a_prompt_ending_partway_through_a_character_is_not_printed_again():
    tok = byte_level_tokenizer()
    ids = tok.encode("Hello é").ids
    assert tok.decode(ids[:-1]) == "Hello \ufffd"  # the prompt stops after 0xC3
    world = tok.encode(" world").ids
    # Not completed: the prompt's U+FFFD is the prompt's, shown with it already.
    assert decode_continuation(tok, ids[:-1], world) == " world"
    # Completed by the first new id: the whole character is new text.
    assert decode_continuation(tok, ids[:-1], ids[-1:] + world) == "é world"
    # The model's own unfinished byte after the prompt's still prints as U+FFFD.
    lead_byte = ids[-2]  # 0xC3 again, then no 0xA9
    assert decode_continuation(tok, ids[:-1], [lead_byte, *world]) == "\ufffd world"
    # Token by token, as a terminal sees it: the prompt's text is in no piece.
    stream = TextStream(tok, ids[:-1])
    pieces = [stream.push(t) for t in ids[-1:] + world]
    assert pieces[0] == "é" and "".join(pieces) == "é world" == stream.text


@pytest.mark.parametrize("text", ["Hello é world", "café naïve 日本 ok", "Hello 🙂!"])
def test_prompt_text_then_continuation_is_the_whole_text_at_every_split(text: str):
    """Split anywhere, even inside a character: what the prompt shows (less its
    unfinished character) followed by the continuation is the text, once."""
    tok = byte_level_tokenizer()
    ids = tok.encode(text).ids
    assert len(ids) > len(text.split())  # the multi-byte characters span several ids
    for k in range(1, len(ids)):
        shown = tok.decode(ids[:k]).rstrip("\ufffd")
        assert shown + decode_continuation(tok, ids[:k], ids[k:]) == text, k


class _Runner:
    """Hands back fixed ids: generate_and_print's text, apart from any model."""

    def __init__(self, new: list[int]) -> None:
        self.new = new

    def stream(self, ids: list[int], n: int, **_: object):
        yield from self.new[:n]

    def generate(self, ids: list[int], n: int, **_: object) -> list[int]:
        return self.new[:n]


def test_run_text_after_an_unfinished_prompt_streamed_and_in_json():
    tok = byte_level_tokenizer()
    ids = tok.encode("Hello é").ids
    prompt, new = ids[:-1], ids[-1:] + tok.encode(" world").ids
    runner = _Runner(new)
    tty, pipe = _Out(True), _Out(False)
    assert generate_and_print(runner, prompt, 9, {}, tok, tty, show=True) == (new, "é world")
    assert "".join(tty.writes) == "é world\n"
    assert generate_and_print(runner, prompt, 9, {}, tok, pipe, show=True) == (new, "é world")
    assert pipe.writes == ["é world\n"]
    # --json: no printing, the same text
    assert generate_and_print(runner, prompt, 9, {}, tok, pipe, show=False)[1] == "é world"


def test_a_folder_without_a_tokenizer_takes_tokens_not_a_prompt(tmp_path: Path, cache: Path):
    recipe, folder = make_checkpoint(tmp_path, tokenizer=False)
    base = [str(recipe), "--weights", str(folder)]
    ok = _run(cache, *base, "--tokens", "1,5,6", "--max-new-tokens", "4")
    assert ok.exit_code == 0, ok.output
    assert len(ok.stdout.split()) == 4  # ids, no text
    _one_error_line(_run(cache, *base, "--prompt", PROMPT), f"no tokenizer.json in {folder}")
    _one_error_line(_run(cache, str(recipe), "--prompt", PROMPT), "no checkpoint folder")


@pytest.mark.parametrize(
    ("args", "contains"),
    [
        (["--temperature", "-1"], "(--temperature) must be a finite number >= 0"),
        (["--temperature", "1", "--top-p", "0"], "(--top-p) must be in (0, 1]"),
        (["--temperature", "1", "--top-p", "1.5"], "(--top-p) must be in (0, 1]"),
        (["--temperature", "1", "--top-k", "0"], "(--top-k) must be an integer >= 1"),
        (["--top-k", "5"], "set a temperature > 0"),
        (["--sample-seed", "3"], "--sample-seed applies to sampling: set --temperature > 0"),
        (["--eos-id", "99999"], "EOS token id 99999 is outside the vocabulary"),
        (["--eos-id", "3", "--no-eos"], "either --eos-id or --no-eos"),
    ],
)
def test_bad_generation_options_exit_1_before_any_build(args, contains, cache: Path):
    _one_error_line(_run(cache, "tiny-llama", "--tokens", "1,2", *args), contains)
    assert list(cache.rglob("manifest.json")) == []


def test_bench_measures_a_folder_with_its_tokenizers_prompt(tmp_path: Path, cache: Path):
    """A folder's derived recipe records no prompt ids: bench encodes the seed prompt with
    the folder's tokenizer.json (issue 33, item 4); without one it says what to do."""
    from tokenizers import Tokenizer

    _, folder = make_checkpoint(tmp_path)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    write_config(folder, tok.get_vocab_size(), eos=None)
    args = ["bench", str(folder), "-b", "eager", "--new-tokens", "4", "--iters", "1",
            "--warmup", "1", "--cache-dir", str(cache), "--json"]  # fmt: skip
    from artifactcache.measure.bench import with_bench_prompt
    from artifactcache.recipes import load_recipe

    recipe = with_bench_prompt(load_recipe(folder))
    assert recipe.bench.prompt_ids == tuple(tok.encode("Hello, my name is").ids)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["new_tokens"] == 4
    (folder / "tokenizer.json").unlink()
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1 and "no tokenizer.json in its checkpoint folder" in r.stderr


def test_a_terminal_gets_control_characters_escaped_and_a_pipe_the_exact_text():
    """A model's text could carry an ESC sequence or a backspace: on a terminal it is
    shown, never obeyed; piped (and in --json) the text is what was generated."""
    tok = byte_level_tokenizer()
    prompt, new = tok.encode("Hello").ids, tok.encode(" \x1b[2J\x08ok\n\tthere").ids
    tty, pipe = _Out(True), _Out(False)
    _, text = generate_and_print(_Runner(new), prompt, 99, {}, tok, tty, show=True)
    assert text == " \x1b[2J\x08ok\n\tthere"  # the text itself is untouched
    assert "".join(tty.writes) == " \\x1b[2J\\x08ok\n\tthere\n"
    generate_and_print(_Runner(new), prompt, 99, {}, tok, pipe, show=True)
    assert pipe.writes == [" \x1b[2J\x08ok\n\tthere\n"]
