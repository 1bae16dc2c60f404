"""User-facing errors.

Every exception a user can cause derives from :class:`AcacheError`. The CLI maps
each one to a single ``error: <message>`` line on stderr and exit code 1, with
no traceback (see ``artifactcache.cli.app.ERROR_EXIT_CODES``). Messages say what
is wrong *and* what to do, in one line.

Anything that is not an ``AcacheError`` is a bug in acache and keeps its
traceback.
"""

from __future__ import annotations


class AcacheError(Exception):
    """Base class: a problem the user can fix. One line, no traceback."""

    def __init__(self, message: str) -> None:
        # Collapse to one line: the CLI promises a single line on stderr.
        super().__init__(" ".join(str(message).split()))


class ArgumentError(AcacheError):
    """A command-line argument is malformed or out of range."""


class RecipeError(AcacheError):
    """A recipe is unknown, unreadable or malformed."""


class WeightsError(AcacheError):
    """Weights are missing, unreadable, or do not match the recipe."""


class BackendError(AcacheError):
    """An unknown backend, or options a backend does not support."""


class BackendUnavailable(BackendError):
    """The backend's optional dependency is not installed or cannot run here."""


class StaleArtifact(BackendError):
    """An intact entry that cannot run on this runtime (e.g. a TensorRT engine from
    another TensorRT version): api.load() rebuilds it once instead of failing."""


class ShapeError(AcacheError):
    """Inputs do not fit the shapes the artifact was built for."""


class GenerationError(AcacheError):
    """Bad generation arguments (sampling, EOS ids, prompt text), or a checkpoint
    tokenizer that cannot be used."""


class KeyLookupError(AcacheError):
    """A key or key prefix matches no entry, or more than one."""


class CacheRootError(AcacheError):
    """The cache root is unusable or unsafe (symlink, foreign owner, shared perms)."""


class IntegrityError(AcacheError):
    """An entry failed digest verification (it has been quarantined)."""


class UntrustedEntry(IntegrityError):
    """A remote entry carries no valid signature by a trusted key; nothing of it was used."""


class BundleError(AcacheError):
    """An export bundle is malformed or unsafe."""


class RemoteError(AcacheError):
    """The remote tier is unreachable, misconfigured, or refused the operation."""


class MeasureError(AcacheError):
    """A measurement child process failed or its arguments are invalid."""


class FilesystemError(AcacheError):
    """The OS refused a read or write (disk full, permission denied, I/O error).

    Never corruption: nothing is quarantined, and a half-written build is never
    published."""


class EntryInUse(AcacheError):
    """An entry cannot be removed now: another process is loading it, or other
    entries depend on it."""


class DependencyError(AcacheError):
    """A dependency acache requires is missing or cannot be imported (a broken install)."""


class ModelSpecError(AcacheError):
    """A user module, its example inputs, or a ``pkg.mod:factory`` spec is unusable."""
