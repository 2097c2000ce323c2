"""``otel-verl traces live`` (text): a trajectory in flight is a row of its own, so its stuck
count and its ops' are printed apart and add up to the STUCK rows (was: "1 trajectories, 3 stuck"
above three STUCK rows, one of them the trajectory's own span)."""

from __future__ import annotations

import contextlib
import io

import otel_verl.store as store
from otel_verl.cli import main


def _op(name: str, stuck: bool, trajectory: bool = False) -> dict:
    return {"name": name, "stuck": stuck, "trajectory": trajectory, "elapsed_s": 12.0,
            "step": 3, "sample_index": 0, "rollout_n": 1}


def test_stuck_trajectories_and_ops_are_counted_apart(monkeypatch, tmp_path):
    view = {"workers": [{
        "worker": "host:1", "lost": False, "heartbeat_age_s": 0.4, "trajectories": 1,
        "stuck": 3, "unsampled": [],
        "ops": [_op("agent_loop", True, trajectory=True), _op("CalculatorTool.execute", True),
                _op("LLMServerClient.generate", True), _op("HermesToolParser.parse", False)],
    }]}
    monkeypatch.setattr(store, "live_workers", lambda _dir: view)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["traces", "live", "--dir", str(tmp_path)]) == 0
    text = out.getvalue()
    header = text.splitlines()[0]
    assert "1 trajectories (1 stuck), 2 stuck ops" in header, header
    assert text.count("STUCK ") == 1 + 2
