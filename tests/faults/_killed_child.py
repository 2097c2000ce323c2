"""Run a child script that SIGKILLs itself once it has done its part (the content store's kill
tests): the project root on its path, ``trace_dir`` as its one argument."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_killed(source: str, trace_dir: Path, marker: str) -> str:
    """``python -c source trace_dir``; asserts it died by SIGKILL after printing ``marker``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", source, str(trace_dir)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert marker in proc.stdout, proc.stdout
    return proc.stdout
