"""backends/shared/patches.py: replacements live while any scope is open."""

from __future__ import annotations

from artifactcache.backends.shared.patches import ProcessPatches


class Owner:
    def method(self) -> str:
        return "torch's"


def test_the_first_scope_installs_and_the_last_restores_in_any_order():
    patches, installs = ProcessPatches(), []
    real = Owner.__dict__["method"]

    def install() -> None:
        installs.append(1)
        patches.replace(Owner, "method", lambda self: "ours")

    first, second = patches.scope(install), patches.scope(install)
    first.__enter__()
    second.__enter__()
    assert installs == [1] and Owner().method() == "ours" and patches.depth == 2
    first.__exit__(None, None, None)  # the first to open closes first
    assert Owner().method() == "ours"
    second.__exit__(None, None, None)
    assert Owner.__dict__["method"] is real and patches.depth == 0
    with patches.scope(install):  # a later scope installs afresh
        assert installs == [1, 1] and Owner().method() == "ours"
    assert Owner().method() == "torch's"
