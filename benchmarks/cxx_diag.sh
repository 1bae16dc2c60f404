#!/usr/bin/env bash
# What backends/cxx.py sees on a machine: the libstdc++ this Python process maps,
# each g++ candidate with the libstdc++ it links, and the compiler acache would pick.
# Usage (repo root): bash benchmarks/cxx_diag.sh
which -a g++ c++ 2>&1; ls -la /usr/bin/g++* /opt/gcc/bin/g++ 2>&1
"${PYTHON:-python3}" - <<'PY'
import torch  # noqa: F401  (maps the runtime the build process will have)
from artifactcache.backends import cxx
print("loaded:", cxx.loaded_libstdcxx())
loaded = cxx.loaded_libstdcxx() or "(none mapped)"
for c in dict.fromkeys([*cxx._candidates("g++")[0], "/opt/gcc/bin/g++"]):
    print("candidate:", c, cxx.compiler_version(c), cxx.compiler_libstdcxx(c),
          cxx.probe_compiler(c, loaded))
print("choice:", cxx.compiler_choice())
PY
