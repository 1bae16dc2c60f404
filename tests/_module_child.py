"""Child process for the module 'second process does not export' tests.

argv: cache_root spec backend. Loads the entry with build_on_miss=False after
making torch.export.export and torch.onnx.export raise, runs the example inputs
once and prints one JSON line: the output, what was imported, Inductor's counters.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.export
import torch.onnx


def _forbidden(*_args, **_kwargs):
    raise AssertionError("a warm load must not export")


torch.export.export = _forbidden
torch.onnx.export = _forbidden


def main() -> None:
    from artifactcache.api import module as module_api
    from artifactcache.sources.module import spec_from_cli

    root, spec_text, backend = sys.argv[1:4]
    spec = spec_from_cli(spec_text, None)
    res, compiled = module_api.compile_with_result(
        spec, backend, cache_dir=root, build_on_miss=False
    )
    out = compiled(*spec.example_inputs)
    utils = sys.modules.get("torch._dynamo.utils")
    counters = {k: dict(v) for k, v in utils.counters.items()} if utils else {}
    report = {
        "source": res.source,
        "key": res.key,
        "output": out.tolist(),
        "inductor_imported": "torch._inductor" in sys.modules,
        "dynamo_imported": "torch._dynamo" in sys.modules,
        "counters": counters,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
