"""Logs every subprocess a Python process starts, with its wall time, when
``ACACHE_CHILDLOG`` names a folder: put this folder first on PYTHONPATH.

For the question "what are the ~50 CPU-seconds of child processes in an aoti step's
compile" (docs/perf-notes.md, attempt 52): g++ on the wrapper, ptxas from Triton, or
something else. Each process appends JSON lines to ``ACACHE_CHILDLOG/<pid>.jsonl``:
the child's program, its first arguments, start and end (perf_counter of this process)
and the wall seconds from Popen to the reaped exit. ``childlog_summary.py`` sums them.
Not imported by acache; a measuring aid only. First on PYTHONPATH, it shadows the
interpreter's own sitecustomize (on the device image, Ubuntu's
/usr/lib/python3.12/sitecustomize.py), which then does not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

_DIR = os.environ.get("ACACHE_CHILDLOG")

if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    _init = subprocess.Popen.__init__
    _handle = subprocess.Popen._handle_exitstatus

    def _logged_init(self, args, *a, **kw):  # type: ignore[no-untyped-def]
        self._childlog_t0 = time.perf_counter()
        return _init(self, args, *a, **kw)

    def _logged_exit(self, *a, **kw):  # type: ignore[no-untyped-def]
        out = _handle(self, *a, **kw)
        t0 = getattr(self, "_childlog_t0", None)
        if t0 is not None:
            argv = self.args if isinstance(self.args, (list, tuple)) else str(self.args).split()
            argv = [str(x) for x in argv]
            rec = {
                "prog": os.path.basename(argv[0]) if argv else "?",
                "argv": [a[-120:] for a in argv[:4]],
                "start": round(t0, 3),
                "wall": round(time.perf_counter() - t0, 3),
                "by": [a[-80:] for a in sys.argv[:3]],
            }
            self._childlog_t0 = None
            try:  # never the measured process's failure: its subprocess calls go on
                with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
                    f.write(json.dumps(rec) + "\n")
            except OSError:
                pass
        return out

    subprocess.Popen.__init__ = _logged_init  # type: ignore[method-assign]
    subprocess.Popen._handle_exitstatus = _logged_exit  # type: ignore[attr-defined]
