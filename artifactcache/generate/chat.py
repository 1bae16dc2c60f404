"""A checkpoint's chat template applied to a conversation, as transformers applies it.

``render_chat`` is ``tokenizer.apply_chat_template(messages, add_generation_prompt=True,
tokenize=False)`` without transformers: the template (sources/checkpoint.py reads it from
the folder) rendered by jinja2 with the options and helpers transformers gives it
(``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``strftime_now``, a ``tojson``
that keeps non-ASCII text) and the special tokens' text (``bos_token``...) as variables.
The rendered text holds its special tokens as text; ``encode(..., special=False)`` turns
it into ids without adding a second BOS, as transformers does.

A template comes from a checkpoint folder, which is untrusted input (docs/security.md):
it runs in jinja2's immutable sandbox, which refuses attribute access to Python
internals and mutation of what it is given, so a template can shape the prompt's text
and nothing else.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..errors import ArgumentError, GenerationError


def messages_for(prompt: str, system: str | None = None) -> list[dict[str, str]]:
    """One user turn, after a system turn when ``system`` is given."""
    turns = [{"role": "system", "content": system}] if system is not None else []
    return [*turns, {"role": "user", "content": prompt}]


def _raise(message: str) -> None:
    raise GenerationError(f"the chat template refused the conversation: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


def render_chat(template: str, messages: list[dict[str, str]], specials: dict[str, str]) -> str:
    """The conversation as the template writes it, ending with the assistant's turn open."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
        # tools and documents None, as transformers passes them when none are given:
        # templates test them with "is not none" as well as "is defined".
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=True, **specials)  # fmt: skip
    except GenerationError:
        raise
    except Exception as e:  # the template is the folder's code: any error it makes is one line
        raise GenerationError(
            f"the checkpoint's chat template failed: {type(e).__name__}: {e}"
        ) from None


def chat_prompt_ids(checkpoint: Any, texts: list[str], system: str | None) -> list[list[int]]:
    """Each text as the user's turn (after ``system``'s) through the checkpoint's chat
    template, then its tokenizer: the ids of each prompt. One-line errors for a folder
    that cannot (no tokenizer.json, no template)."""
    from .checkpoint import encode

    folder = getattr(checkpoint, "folder", None)
    if checkpoint is None or checkpoint.tokenizer is None:
        where = f"no tokenizer.json in {folder}" if folder else "no checkpoint folder"
        raise ArgumentError(f"--chat needs a checkpoint's tokenizer and chat template: {where}")
    found = checkpoint.chat_template
    if found is None:
        raise ArgumentError(
            f"no chat template in {folder} (chat_template.jinja, or tokenizer_config.json's "
            "chat_template): drop --chat and --system to encode the text as it is"
        )
    template, specials = found
    return [
        encode(
            checkpoint.tokenizer,
            render_chat(template, messages_for(t, system), specials),
            add_special_tokens=False,
        )  # fmt: skip
        for t in texts
    ]
