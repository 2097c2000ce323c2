"""Collector tier: real rotel collector hops, a real local Ray cluster, config checks.

The tests import their OTLP helpers (`_collector_otlp`) from this directory; with
`--import-mode=importlib` pytest does not put it on sys.path, so this does.
"""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
