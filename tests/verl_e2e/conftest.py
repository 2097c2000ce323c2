"""verl_e2e tier: unchanged verl 0.9.1 trains on CPU (``python -m verl.trainer.main_ppo``), traced.

Each run takes minutes: the tier runs few of them (see test_main_ppo.py) and every test reads the
outputs of a module-scoped run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))                       # _run, _model
sys.path.insert(0, str(HERE.parent / "collector"))  # _collector_otlp (the rotel collector)
sys.path.insert(0, str(HERE.parent / "weave"))      # _weave_server (Weave's own trace server)


@pytest.fixture(scope="session")
def tool_model() -> Path:
    from _model import tool_model as build

    return build()
