"""generate/chat.py: a checkpoint's chat template applied as transformers applies it
(against transformers' own apply_chat_template), in jinja2's sandbox, and through
`acache run --chat`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _generate_util import make_checkpoint, write_config
from typer.testing import CliRunner

from artifactcache.cli.app import app
from artifactcache.errors import AcacheError, GenerationError
from artifactcache.generate.chat import chat_prompt_ids, messages_for, render_chat
from artifactcache.generate.checkpoint import Checkpoint

transformers = pytest.importorskip("transformers")

# In the test tokenizer's words (tests/_generate_util.py WORDS), with its <s> and </s>.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ 'we talk about ' + m['content'] + ' ' }}"
    "{% else %}{{ 'bob ' + m['content'] + ' ' + eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ ' the cat' }}{% endif %}"
)


def _folder_with_template(tmp_path: Path, template: str = TEMPLATE):
    """A checkpoint folder whose tokenizer files transformers itself wrote."""
    _, folder = make_checkpoint(tmp_path)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token="<s>", eos_token="</s>",
        unk_token="[UNK]",
    )  # fmt: skip
    hf.chat_template = template
    hf.save_pretrained(folder)
    return folder, hf


def _hf_ids(hf, messages) -> list[int]:
    out = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("system", [None, "tokens that stream"])
def test_the_ids_are_transformers_apply_chat_template_ids(tmp_path: Path, system):
    folder, hf = _folder_with_template(tmp_path)
    texts = ["hello my name is", "the cat sat on a mat"]
    ids = chat_prompt_ids(Checkpoint(folder), texts, system)
    assert ids == [_hf_ids(hf, messages_for(t, system)) for t in texts]
    assert ids[0][0] == hf.bos_token_id and ids[0].count(hf.bos_token_id) == 1  # one BOS


# Block tags on lines of their own, indented, as real templates are written: the text
# depends on trim_blocks and lstrip_blocks being transformers' choices.
LINES = """{{ bos_token }}
{% for m in messages %}
    {% if m['role'] == 'system' %}
<<SYS>>{{ m['content'] | tojson }}<</SYS>>
    {% else %}
[INST] {{ m['content'] }} [/INST]{{ eos_token }}
    {% endif %}
{% endfor %}
{% if tools is not none %}tools{% endif %}
{% if add_generation_prompt %}
  assistant:
{% endif %}"""


@pytest.mark.parametrize("system", [None, 'héllo "quoted"'])
def test_the_text_is_transformers_apply_chat_template_text(tmp_path: Path, system):
    folder, hf = _folder_with_template(tmp_path, LINES)
    messages = messages_for("a prompt\nof two lines", system)
    want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    template, specials = Checkpoint(folder).chat_template
    assert render_chat(template, messages, specials) == want


def test_a_named_template_list_gives_the_default_and_tokens_may_be_added_token_dicts(
    tmp_path: Path,
):
    folder, hf = _folder_with_template(tmp_path)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "x"},
                               {"name": "default", "template": TEMPLATE}]  # fmt: skip
    config["bos_token"] = {"content": "<s>", "lstrip": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ids = chat_prompt_ids(Checkpoint(folder), ["hello"], None)
    assert ids == [_hf_ids(hf, messages_for("hello"))]


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # reach Python's internals
        "{% set _ = messages.append({}) %}",  # change what it is given
        "{{ raise_exception('only user turns') }}",
        "{{ 1 // 0 }}",
        "{% for %}",
    ],
)
def test_a_hostile_or_broken_template_is_one_line(template):
    with pytest.raises(GenerationError) as e:
        render_chat(template, messages_for("hi"), {})
    assert "chat template" in str(e.value) and "\n" not in str(e.value)


def _run(cache: Path, *args: str):
    return CliRunner().invoke(app, ["run", *args, "--cache-dir", str(cache)])


def test_run_chat_generates_from_the_templated_prompt(tmp_path: Path, cache_dir: Path):
    folder, hf = _folder_with_template(tmp_path)
    write_config(folder, hf.vocab_size, eos=None)
    base = [str(folder), "-b", "eager", "--new-tokens", "3", "--json"]
    r = _run(cache_dir, *base, "--chat", "--prompt", "hello my name is")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["prompt_ids"] == _hf_ids(hf, messages_for("hello my name is"))
    r = _run(cache_dir, *base, "--system", "tokens", "--prompt", "hello")
    assert json.loads(r.stdout)["prompt_ids"] == _hf_ids(hf, messages_for("hello", "tokens"))


def test_chat_without_a_template_or_on_tokens_is_one_line_before_any_build(
    tmp_path: Path, cache_dir: Path
):
    _, folder = make_checkpoint(tmp_path)
    write_config(folder, 40, eos=None)
    for args, needle in [
        (["--chat", "--prompt", "hello"], "no chat template in"),
        (["--chat", "--tokens", "1,2"], "apply to --prompt text, not to --tokens"),
    ]:
        r = _run(cache_dir, str(folder), "-b", "eager", *args)
        assert r.exit_code == 1 and r.stderr.startswith("error: ") and needle in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    r = _run(cache_dir, "tiny-llama", "--chat", "--prompt", "hello")
    assert r.exit_code == 1 and "no checkpoint folder" in r.stderr
    assert list(cache_dir.rglob("manifest.json")) == []
    with pytest.raises(AcacheError):
        chat_prompt_ids(None, ["x"], None)
