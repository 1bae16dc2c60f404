"""Child process for the 'second process does not compile' tests.

argv: cache_root recipe backend prompt_json n_new [device [dtype [mode]]]. Prints
one JSON line: every C++ compiler invocation Inductor made, Dynamo/Inductor
counters, generated ids, and the load phases in seconds since the child started.
Also usable by hand on a GPU machine (see docs/backends.md). With
ACACHE_TEST_WITHOUT_AOT_COMPILE=1 its torch lacks torch.compiler.load_compiled_function.
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = time.perf_counter()

import torch  # noqa: E402 (timed from T0)
import torch._inductor.cpp_builder as cpp_builder  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

if os.environ.get("ACACHE_TEST_WITHOUT_AOT_COMPILE") == "1":  # _backend_util.NO_AOT_COMPILE_ENV
    del torch.compiler.load_compiled_function

compiles: list[str] = []
_orig_build = cpp_builder.CppBuilder.build


def _counting_build(self, *args, **kwargs):
    compiles.append(str(self.get_target_file_path()))
    return _orig_build(self, *args, **kwargs)


cpp_builder.CppBuilder.build = _counting_build

# Inductor's CPU ISA probes (a child Python each) this process ran: a kept verdict
# (backends/shared/cpu_isa.py) runs none.
isa_probes: list[str] = []
try:
    from torch._inductor.cpu_vec_isa import VecISA  # noqa: E402

    _orig_probe_load = VecISA._probe_load

    def _counting_probe_load(self, output_path):
        isa_probes.append(str(self))
        return _orig_probe_load(self, output_path)

    VecISA._probe_load = _counting_probe_load
except (ImportError, AttributeError):  # another torch: nothing counted
    pass


def main() -> None:
    from artifactcache import api
    from artifactcache.backends.base import BuildContext

    root, recipe, backend, prompt, n = sys.argv[1:6]
    device, dtype, mode = (sys.argv[6:9] + ["cpu", "fp32", ""][len(sys.argv[6:9]) :])[:3]
    ctx = BuildContext(recipe=None, opts=None, weights=None)  # api.load fills it
    runner = api.load(
        recipe,
        backend,
        device=device,
        dtype=dtype,
        mode=mode or None,
        cache_dir=root,
        build_on_miss=False,
        context=ctx,
    )
    t_loaded = time.perf_counter()
    unopened_at_load = _unopened(runner)
    ids = runner.generate(json.loads(prompt), 1)
    t_first = time.perf_counter()
    ids = runner.generate(json.loads(prompt), int(n))
    t_done = time.perf_counter()
    report = {
        "unopened": {"at_load": unopened_at_load, "after": _unopened(runner)},
        "compiles": compiles,
        "isa_probes": isa_probes,
        "counters": {k: dict(v) for k, v in counters.items()},
        "ids": ids,
        "phases": {k: round(v - T0, 3) for k, v in ctx.phases.items()},
        "seconds": {
            "load": round(t_loaded - T0, 3),
            "first_token": round(t_first - T0, 3),
            "generate_n": round(t_done - t_first, 3),
        },
    }
    print(json.dumps(report))


def _unopened(runner) -> list[str]:
    """The runner's steps not opened yet (backends/shared/steps.py's LazyStep)."""
    names = ("fresh_step", "prefill_step", "extend_step", "decode_step")
    return sorted(n for n in names if getattr(getattr(runner, n, None), "opened", True) is False)


if __name__ == "__main__":
    main()
