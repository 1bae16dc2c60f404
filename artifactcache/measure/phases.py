"""What the probe child and its parent agree on: the phases, the clock variable, the schema.

Both sides import this small module, so coldstart.py (the parent) never imports the
child's code (measure/child/); the child reads no more of the parent than bench.py's
torch-free arithmetic.
"""

from __future__ import annotations

# The parent's time.monotonic() just before the spawn (settings: ACACHE_PROBE_T0).
T0_ENV = "ACACHE_PROBE_T0"
SCHEMA = 1  # of the probe's JSON line
PHASE_ORDER = (
    "python_ready",
    "imports_done",
    "load_called",
    "entry_ready",
    "weights_ready",
    "artifact_ready",
    "first_result",
    "first_request",
    "done",
)
