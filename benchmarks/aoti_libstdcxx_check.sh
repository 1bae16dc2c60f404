#!/usr/bin/env bash
# Diagnose the AOTInductor load segfault on the GPU image (torch 2.11+cu130), then
# try the candidate fix. Background: cuda-gdb (benchmarks/aoti_load_probe.py) shows
# the crash inside std::regex compilation, in parse_device_str() of the wrapper .so's
# AOTInductorModel constructor: a C++ runtime mismatch between the g++ that built the
# wrapper and the libstdc++ the Python process has loaded.
# Usage (GPU machine, repo root): bash benchmarks/aoti_libstdcxx_check.sh OUTDIR
set -u
out=${1:?outdir}
export ACACHE_DIR=/tmp/ac-fix; mkdir -p -m 700 "$ACACHE_DIR"
{
  echo "== compiler"; g++ --version | head -1; g++ -print-file-name=libstdc++.so.6
  echo "== libstdc++ mapped by python after 'import torch'"
  python3 -c "import torch,re; print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++' in l}))"
  echo "== every libstdc++ on the image"
  find / -xdev -name 'libstdc++.so.6*' 2>/dev/null | head -20
  for f in $(find / -xdev -name 'libstdc++.so.6' 2>/dev/null | head -8); do
    echo "$f: $(strings -a "$f" | grep -E '^GLIBCXX_3\.4\.[0-9]+$' | sort -V | tail -1)"; done
} > "$out/libstdcxx_diag.txt" 2>&1
cat "$out/libstdcxx_diag.txt"
sys_lib=$(g++ -print-file-name=libstdc++.so.6)
python3 -m artifactcache.cli build tiny-llama -b aoti --device cuda --dtype bf16 --json > "$out/fix_build.json" 2>&1
echo "build rc=$?"
run() { python3 -m artifactcache.cli run tiny-llama -b aoti --device cuda --dtype bf16 --tokens 1,15043,29892 --max-new-tokens 8 --json; }
( run ) > "$out/fix_plain.log" 2>&1; echo "plain rc=$?"
( export LD_PRELOAD=$(readlink -f "$sys_lib"); run ) > "$out/fix_preload.log" 2>&1; echo "LD_PRELOAD=$sys_lib rc=$?"
tail -3 "$out/fix_preload.log"
