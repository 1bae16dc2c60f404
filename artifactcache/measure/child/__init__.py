"""What runs inside the measured child process (``python -m artifactcache.measure.child.probe``).

The parent side (coldstart.py, bench.py, compare.py, report.py) never imports this
package: the two share only measure/phases.py, and the probe's JSON line.
"""
