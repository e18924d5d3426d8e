"""Test configuration: import paths and hypothesis profiles.

``GDB_HYPOTHESIS_PROFILE=long`` runs the property tests with many more cases;
``GDB_HYPOTHESIS_EXAMPLES=N`` with exactly N each.
"""
import os
import sys

from hypothesis import HealthCheck, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if path not in sys.path:
        sys.path.insert(0, path)

# The default run draws the same examples every time (a failure reproduces);
# GDB_HYPOTHESIS_PROFILE=long, or GDB_HYPOTHESIS_EXAMPLES=N, draw new ones.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# GDB_HYPOTHESIS_EXAMPLES=N runs every property test with N cases instead.
if os.environ.get("GDB_HYPOTHESIS_EXAMPLES"):
    settings.register_profile("examples", max_examples=int(os.environ["GDB_HYPOTHESIS_EXAMPLES"]),
                              deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("examples")
else:
    settings.load_profile(os.environ.get("GDB_HYPOTHESIS_PROFILE", "ci"))
