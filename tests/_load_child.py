"""Child process for the 'second process does not compile' tests.

argv: cache_root recipe backend prompt_json n_new. Prints one JSON line: every
C++ compiler invocation Inductor made, Dynamo/Inductor counters, generated ids.
"""

from __future__ import annotations

import json
import sys

import torch._inductor.cpp_builder as cpp_builder
from torch._dynamo.utils import counters

compiles: list[str] = []
_orig_build = cpp_builder.CppBuilder.build


def _counting_build(self, *args, **kwargs):
    compiles.append(str(self.get_target_file_path()))
    return _orig_build(self, *args, **kwargs)


cpp_builder.CppBuilder.build = _counting_build


def main() -> None:
    from artifactcache import api
    from artifactcache.backends.base import BuildContext

    root, recipe, backend, prompt, n = sys.argv[1:6]
    ctx = BuildContext(recipe=None, opts=None, weights=None)  # api.load fills it
    runner = api.load(recipe, backend, cache_dir=root, build_on_miss=False, context=ctx)
    ids = runner.generate(json.loads(prompt), int(n))
    report = {
        "compiles": compiles,
        "counters": {k: dict(v) for k, v in counters.items()},
        "ids": ids,
        "phases": sorted(ctx.phases),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
