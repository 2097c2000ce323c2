"""The e2e runner itself (``_run._wait``): a run that prints a line it cannot recover from (a dead
vLLM engine, a failed weight sync) is ended after a short grace, not after its whole timeout.

Real processes, no verl: a child that prints the fatal line and then hangs, as verl's driver does
when its engine died under it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import _run
import pytest

HANGS = "import sys, time; print({line!r}, flush=True); time.sleep(600)"


@pytest.mark.parametrize("line", [m.decode() for m in _run.FATAL])
def test_a_fatal_line_ends_a_hanging_run_after_the_grace(tmp_path: Path, line: str,
                                                         monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_run, "FATAL_GRACE_S", 1.0)
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", HANGS.format(line=f"x {line} y")],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        start = time.monotonic()
        try:
            with pytest.raises(_run.FatalLine) as raised:
                _run._wait(proc, log, start + 300)
        finally:
            _run._kill_group(proc)
    assert raised.value.line == line
    assert time.monotonic() - start < 120  # a bound far below the 300 s deadline, not a speed


def test_a_run_that_exits_after_a_fatal_line_is_not_ended(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_run, "FATAL_GRACE_S", 30.0)
    log = tmp_path / "run.log"
    code = "import time; print('EngineDeadError', flush=True); time.sleep(2)"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out,
                                stderr=subprocess.STDOUT)
        _run._wait(proc, log, time.monotonic() + 300)
    assert proc.returncode == 0


def test_a_fatal_line_split_across_reads_is_still_seen(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_run, "FATAL_GRACE_S", 1.0)
    log = tmp_path / "run.log"
    code = ("import sys, time; sys.stdout.write('Engine'); sys.stdout.flush(); time.sleep(2.5); "
            "print('DeadError', flush=True); time.sleep(600)")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with pytest.raises(_run.FatalLine):
                _run._wait(proc, log, time.monotonic() + 300)
        finally:
            _run._kill_group(proc)
