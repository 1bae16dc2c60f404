"""What runs inside the measured child process (``python -m artifactcache.measure.child.probe``).

The parent side (coldstart.py, bench.py, compare.py, report.py) never imports this
package. The child imports measure/phases.py (what both agree on) and bench.py's
torch-free arithmetic (latency percentiles, new-token counts); the parent reads the
probe's JSON line.
"""
