"""Every ``ACACHE_*`` environment variable acache reads, declared once.

Each ``Setting`` names its variable, its kind, its default and what it does;
``acache doctor`` lists them. Code reads a variable only through ``get`` (parsed
by limits' ``env_bool`` / ``env_int`` / ``env_choice``, so a bad value is the same
one-line error naming the variable and what it accepts) or ``raw`` (the text, for
the few settings parsed where they are used, each with its own error:
``parsed_by`` names that place). tests/test_settings.py fails on an ``ACACHE_*``
name in artifactcache/ that is not declared here, and on one declared but unused.

Only what the package reads is here. The tests' own variables (ACACHE_TEST_*, and
the TensorRT stand-in's bindings-wheel variable in tests/_trt_standin.py) are not:
users never set them, and doctor would list them as if they were settings. Writes
(measure/coldstart.py setting ACACHE_DIR and ACACHE_PROBE_T0 for its probe child)
stay plain edits of the child's environment.
No torch here: the store and the CLI use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .errors import AcacheError
from .limits import env_bool, env_choice, env_int

KINDS = ("bool", "int", "float", "choice", "path", "str")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # one of KINDS
    default: Any  # in effect when unset or empty; None: no value (the doc says what then)
    doc: str
    choices: tuple[str, ...] = ()  # kind "choice"
    lo: int = 1  # kind "int": accepted range
    hi: int = 1 << 16
    parsed_by: str = ""  # parsed there (its own error), read with raw(); get() refuses it
    internal: bool = False  # set by acache itself for a child process, not by users


_ALL = (
    # -- the store
    Setting("ACACHE_DIR", "path", None,
            "cache root (--cache-dir); unset: the platform's user cache dir"),
    Setting("ACACHE_ALLOW_SHARED_ROOT", "bool", False,
            "accept a cache root that is a symlink, another user's, or group/world-writable"),
    Setting("ACACHE_VERIFY", "choice", "memo",
            "full: re-hash every file on every hit; memo: trust the stat memo",
            choices=("full", "memo")),
    # -- the remote tier
    Setting("ACACHE_REMOTE", "str", None,
            "shared remote tier (--remote), e.g. s3://bucket/prefix"),
    Setting("ACACHE_REMOTE_READ_ONLY", "bool", False,
            "pull from the remote, never push (--remote-read-only)"),
    Setting("ACACHE_REMOTE_TRUST_UNSIGNED", "bool", False,
            "use remote entries no trusted key signed (--remote-trust-unsigned)"),
    Setting("ACACHE_SIGNING_KEY", "path", None,
            "builder's Ed25519 private key file: signs what this host pushes (--signing-key)"),
    Setting("ACACHE_TRUSTED_KEYS", "str", None,
            "comma-separated files of ssh-ed25519 public keys that pulled entries must be "
            "signed by (--trusted-keys)"),
    # -- building
    Setting("ACACHE_BUILD_JOBS", "int", None,
            "aoti and inductor (aot_compile path) steps built at once (1: serially, in this "
            "process); unset: all on CUDA or with >= 8 usable cores, else 1",
            parsed_by="backends/shared/build_plan.py"),
    Setting("ACACHE_BUILD_TIMEOUT", "float", 7200.0,
            "seconds the aoti and inductor build workers may take",
            parsed_by="backends/shared/build_plan.py"),
    Setting("ACACHE_INDUCTOR_WARM_PATH", "choice", None,
            "inductor warm path; unset: aot_compile where torch can save it, else megacache",
            choices=("aot_compile", "megacache"), parsed_by="backends/inductor/backend.py"),
    Setting("ACACHE_CUDA_GRAPHS", "bool", True,
            "capture CUDA graphs of the decode step (0: off)"),
    Setting("ACACHE_LAZY_STEPS", "bool", True,
            "inductor: open the prompt-pass steps at their first use, not at load (0: all at "
            "load, so no request pays an opening)"),
    Setting("ACACHE_ORT_VERBOSE", "bool", False,
            "show ONNX Runtime's own log (which optimizer passes ran)"),
    Setting("ACACHE_VERBOSE", "bool", False,
            "show third-party FutureWarning and DeprecationWarning lines, in acache and the "
            "processes it starts (acache --verbose)"),
    # -- loading weights
    Setting("ACACHE_LOAD_THREADS", "int", None,
            "weights loader threads; unset: min(8, the CPUs this process may use)"),
    Setting("ACACHE_LOAD_CHUNK_MB", "int", 16,
            "weights loader read size, MiB"),
    # -- internal
    Setting("ACACHE_PROBE_T0", "float", None,
            "the parent's spawn time, written by `acache coldstart` and `compare` "
            "for their probe child",
            parsed_by="measure/child/probe.py", internal=True),
)  # fmt: skip
SETTINGS: dict[str, Setting] = {s.name: s for s in _ALL}


def raw(name: str) -> str:
    """The variable's text as set ("" when unset), for a declared name."""
    return os.environ.get(SETTINGS[name].name, "")


def get(name: str) -> Any:
    """The declared variable's value in effect, parsed by its kind; unset or empty:
    its default. A bad value is the one-line ArgumentError of limits' parsers."""
    s = SETTINGS[name]
    if s.parsed_by:
        raise TypeError(f"{name} is parsed by {s.parsed_by}; read it with settings.raw()")
    if s.kind == "bool":
        return env_bool(name, s.default)
    if s.kind == "int":
        value = env_int(name, s.lo, s.hi)
        return s.default if value is None else value
    if s.kind == "choice":
        return env_choice(name, s.choices, s.default)
    return os.environ.get(name) or s.default  # path, str: the text as given


# Read when an entry loads (or its weights are read), which may come after minutes of
# building: make_context parses them with the arguments. The store's settings fail when
# the store opens, before any build; ACACHE_VERBOSE's bad value fails nothing.
READ_AT_LOAD = (
    "ACACHE_CUDA_GRAPHS", "ACACHE_LAZY_STEPS", "ACACHE_ORT_VERBOSE", "ACACHE_LOAD_THREADS",
    "ACACHE_LOAD_CHUNK_MB",
)  # fmt: skip


def check_load_settings() -> None:
    """Parse READ_AT_LOAD: the first bad value is its one-line ArgumentError."""
    for name in READ_AT_LOAD:
        get(name)


def report() -> list[dict[str, Any]]:
    """One row per setting for `acache doctor`: name, kind, value (None: unset, the
    default is in effect), default, doc, internal, problem (why a value is refused)."""
    rows = []
    for s in _ALL:
        value = os.environ.get(s.name) or None
        problem = None
        if value is not None and not s.parsed_by:
            try:
                get(s.name)
            except AcacheError as e:
                problem = str(e)
        rows.append(
            {
                "name": s.name,
                "kind": s.kind,
                "value": value,
                "default": s.default,
                "doc": s.doc,
                "internal": s.internal,
                "problem": problem,
            }
        )
    return rows
