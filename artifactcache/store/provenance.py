"""Where each local entry came from, and what that lets this host do with it.

The local store writes an entry's ``provenance`` into its manifest when the entry
arrives (manifest.py has the shape): built here, pulled from a remote (and whose
signature it carried), or imported from a bundle (and whose verified signature
it carried). It is never taken from an incoming manifest, so a bundle or a bucket
cannot vouch for itself. Two decisions read it, against today's trusted keys:

* serving (``TrustMixin.untrusted``): a pulled entry is served while this host
  would still pull it; built and imported entries always are;
* pushing (``push_problem``): only what this host built, or what arrived signed
  by a key trusted today, is pushed (and so signed by this host).

docs/cache.md ("Provenance") says why, and names the tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import BundleError, RemoteError, UntrustedEntry
from . import manifest as schema
from .entry import Entry, public_provenance

if TYPE_CHECKING:
    from .signing import Opened, Trust

BUILT: dict[str, Any] = {"source": "built"}
UNSIGNED_IMPORT: dict[str, Any] = {"source": "imported", "signer": None}


def pulled(url: str, opened: Opened) -> dict[str, Any]:
    """The provenance of an entry pulled from ``url`` with this (checked) manifest object."""
    prov: dict[str, Any] = {"source": "pulled", "remote": url, "signer": None}
    if opened.signer is not None and opened.signature_ok and opened.envelope is not None:
        prov.update(signer=opened.signer, envelope=opened.envelope)
    return prov


def imported(src: str, key: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The provenance of an entry imported from bundle ``src`` with this manifest.

    A manifest exported from a pulled or signed import carries the envelope it came
    with. Its signer is recorded only if the signature verifies for this key and
    signs exactly this manifest's content; a signature that does not is tampering
    or damage, and the entry is refused (BundleError). Anything else the bundle
    says about where the entry came from is ignored.
    """
    name = src.rsplit("/", 1)[-1]
    envelope = (manifest.get("provenance") or {}).get("envelope")
    if not isinstance(envelope, dict):
        return {**UNSIGNED_IMPORT, "bundle": name}
    from . import signing

    refused = f"{src}: entry {key[:12]} carries a signature that does not verify; refusing it"
    try:
        opened = signing.open_envelope(json.dumps(envelope).encode(), key)
        signed = schema.parse(opened.payload)
    except RemoteError:  # no cryptography here: the signature cannot be checked
        return {**UNSIGNED_IMPORT, "bundle": name}
    except (UntrustedEntry, ValueError):
        raise BundleError(refused) from None
    ok = isinstance(signed, dict) and schema.content(signed) == schema.content(manifest)
    if not (opened.signature_ok and ok):
        raise BundleError(refused)
    return {"source": "imported", "bundle": name, "signer": opened.signer, "envelope": envelope}


def describe(prov: dict[str, Any]) -> str:
    """One line for `acache show`."""
    source, signer = prov.get("source"), prov.get("signer")
    signed = f"signed by {signer}" if signer else "unsigned"
    if source == "built":
        return "built here"
    if source == "pulled":
        return f"pulled from {prov.get('remote', '?')}, {signed}"
    if source == "imported":
        return f"imported from {prov.get('bundle', 'a bundle')}, {signed}"
    return "unknown (cached before acache recorded provenance)"


def _trusted(prov: dict[str, Any], trust: Trust) -> bool:
    return prov.get("signer") is not None and prov["signer"] in trust.keys.values()


def push_problem(entry: Entry, trust: Trust) -> str | None:
    """Why this host must not push (and sign) ``entry``, or None."""
    prov = public_provenance(entry.manifest)
    source = prov.get("source")
    if source == "built" or (source in ("pulled", "imported") and _trusted(prov, trust)):
        return None
    if source == "unknown":
        why = "has no recorded provenance (cached before acache recorded it)"
    elif prov.get("signer"):
        why = f"was {describe(prov)}, which is not a trusted key here"
    else:
        why = f"was {describe(prov)}"
    return (
        f"push of {entry.key[:12]} refused: it {why}; only entries built here or signed "
        "by a trusted key are pushed (rebuild it here with `acache build --force`)"
    )


class TrustMixin:
    """Revocation, for :class:`~artifactcache.store.local.LocalStore`."""

    # Today's trusted keys: a Trust, a function that makes one (called at the first
    # pulled entry), or None for ACACHE_TRUSTED_KEYS and friends (signing.trust_from).
    trust: Trust | Callable[[], Trust] | None
    # A pulled entry whose signer is no longer trusted: rebuilt by get_or_build
    # (True) or refused with UntrustedEntry (False).
    rebuild_untrusted: bool

    def _trust(self) -> Trust:
        if self.trust is None or callable(self.trust):
            from .signing import trust_from

            self.trust = trust_from() if self.trust is None else self.trust()
        return self.trust

    def untrusted(self, entry: Entry) -> str | None:
        """Why a pulled entry may no longer be served here, or None.

        A pulled entry is served while this host would still pull it: signed by a
        key trusted today, or any entry while unsigned entries are trusted.
        Removing a key from the trusted set stops its entries at the next load.
        """
        prov = entry.manifest.get("provenance") or {}
        if prov.get("source") != "pulled":
            return None
        trust = self._trust()
        if _trusted(prov, trust) or trust.allow_unsigned:
            return None
        if prov.get("signer"):
            how = f"signed by {prov['signer']}, which is no longer a trusted key"
        else:
            how = "unsigned, and this host no longer uses unsigned entries"
        return f"entry {entry.key[:12]} was pulled from {prov.get('remote', 'a remote')} {how}"

    def _served(self, entry: Entry, *, rebuild: bool | None = None) -> Entry | None:
        """The entry if it may be served; None (rebuild it) or UntrustedEntry if not."""
        if (why := self.untrusted(entry)) is None:
            return entry
        if self.rebuild_untrusted if rebuild is None else rebuild:
            return None
        signed = (entry.manifest.get("provenance") or {}).get("signer")
        trust = "trust its key again" if signed else "pass --remote-trust-unsigned"
        rebuild_it = "--rebuild-untrusted on build/run rebuilds it here, or "
        rebuild_it = rebuild_it if rebuild is None else ""
        raise UntrustedEntry(f"{why}; not served: {trust}, {rebuild_it}remove it (`acache rm`)")
