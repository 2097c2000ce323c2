"""otel-verl CLI: traces list/show/replay over the local store, demo dispatch."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import types
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Status, StatusCode

from otel_verl import semconv
from otel_verl.cli import PREVIEW_CHARS, main
from otel_verl.exporters._file_exporter import ENV_TRACE_DIR, FileSpanExporter

LONG_PROMPT = "tell me a story " * 100  # far over the preview


class SeededIds(IdGenerator):
    """Random-looking but reproducible ids."""

    def __init__(self, seed: int = 7) -> None:
        self._rng = random.Random(seed)

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128)

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64)


def _trajectory(tracer, step, sample, rollout=0, validate=False, fail=False, experiment="exp"):
    attrs = {
        semconv.ROLLOUT_STEP: step,
        semconv.ROLLOUT_SAMPLE_INDEX: sample,
        semconv.ROLLOUT_ROLLOUT_N: rollout,
        semconv.ROLLOUT_VALIDATE: validate,
        semconv.ROLLOUT_EXPERIMENT_NAME: experiment,
    }
    with tracer.start_as_current_span(
        "rollout_trace", attributes={**attrs, semconv.OTEL_VERL_TRAJECTORY: True}
    ) as root:
        with tracer.start_as_current_span(
            "ToolAgentLoop.run",
            attributes={**attrs, semconv.OPENINFERENCE_SPAN_KIND: semconv.SpanKindName.AGENT},
        ) as run:
            run.set_attribute(semconv.INPUT_VALUE, json.dumps({"prompt": LONG_PROMPT}))
            run.set_attribute(semconv.OUTPUT_VALUE, json.dumps({"answer": f"s{sample}r{rollout}"}))
            with tracer.start_as_current_span("ToolAgentLoop.generate", attributes=attrs):
                pass
            if fail:
                with tracer.start_as_current_span(
                    "CalculatorTool.execute",
                    attributes={**attrs, semconv.OPENINFERENCE_SPAN_KIND: semconv.SpanKindName.TOOL},
                ) as tool:
                    try:
                        raise ZeroDivisionError("division by zero")
                    except ZeroDivisionError as error:
                        tool.record_exception(error)
                        tool.set_status(Status(StatusCode.ERROR, "ZeroDivisionError: division by zero"))
        root.set_attribute(semconv.ROLLOUT_REWARD, 0.5 + sample)
        root.set_attribute(semconv.ROLLOUT_NUM_TURNS, 3)
        return f"{root.get_span_context().trace_id:032x}"


@pytest.fixture
def store(tmp_path):
    """Steps 1-2 x samples 0-1 x rollouts 0-1 (training), one validation, one failing (step 3)."""
    directory = tmp_path / "traces"
    provider = TracerProvider(
        resource=Resource.create({"service.name": "cli-test"}), id_generator=SeededIds()
    )
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(directory)))
    tracer = provider.get_tracer("otel_verl")
    ids = {}
    for step in (1, 2):
        for sample in (0, 1):
            for rollout in (0, 1):
                ids[(step, sample, rollout)] = _trajectory(tracer, step, sample, rollout)
    ids["validate"] = _trajectory(tracer, 2, 9, validate=True)
    ids["failing"] = _trajectory(tracer, 3, 0, fail=True)
    provider.shutdown()
    return directory, ids


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _rows(out):
    lines = out.splitlines()
    header = lines[0].split()
    return header, [dict(zip(header, line.split(), strict=False)) for line in lines[1:]]


# --- list ---------------------------------------------------------------------------------------


def test_list_prints_one_row_per_trajectory(store, capsys):
    directory, ids = store
    rc, out, err = _run(capsys, "traces", "list", "--dir", str(directory))
    assert rc == 0 and err == ""
    header, rows = _rows(out)
    assert header == ["TRACE", "EXPERIMENT", "STEP", "SAMPLE", "ROLLOUT", "VALIDATE", "REWARD",
                      "TURNS", "SPANS", "DURATION", "STATUS"]
    assert len(rows) == 10
    first = rows[0]
    assert ids[(1, 0, 0)].startswith(first["TRACE"]) and len(first["TRACE"]) >= 12
    assert first == {**first, "EXPERIMENT": "exp", "STEP": "1", "SAMPLE": "0", "ROLLOUT": "0",
                     "VALIDATE": "no", "REWARD": "0.5", "TURNS": "3", "SPANS": "3", "STATUS": "ok"}
    assert rows[-1]["STATUS"] == "error(1)" and rows[-1]["SPANS"] == "4"
    assert rows[-2]["VALIDATE"] == "yes" and rows[-2]["SAMPLE"] == "9"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--step", "2"], {(2, 0, 0), (2, 0, 1), (2, 1, 0), (2, 1, 1), (2, 9, 0)}),
        (["--step", "2", "--no-validate"], {(2, 0, 0), (2, 0, 1), (2, 1, 0), (2, 1, 1)}),
        (["--validate"], {(2, 9, 0)}),
        (["--sample-index", "1", "--rollout-n", "1"], {(1, 1, 1), (2, 1, 1)}),
        (["--sample-index", "0", "--step", "3"], {(3, 0, 0)}),
        (["--experiment", "exp", "--step", "1", "--rollout-n", "0"], {(1, 0, 0), (1, 1, 0)}),
        (["--experiment", "other"], set()),
    ],
)
def test_list_filters(store, capsys, flags, expected):
    directory, _ = store
    rc, out, err = _run(capsys, "traces", "list", "--dir", str(directory), *flags)
    assert rc == 0
    if expected:
        _, rows = _rows(out)
        assert {(int(r["STEP"]), int(r["SAMPLE"]), int(r["ROLLOUT"])) for r in rows} == expected
        assert len(rows) == len(expected)
    else:
        assert out == "" and "no trajectories match" in err and "(10 in the store)" in err
    rc, out, _ = _run(capsys, "traces", "list", "--dir", str(directory), "--json", *flags)
    summaries = json.loads(out)
    assert {(s["step"], s["sample_index"], s["rollout_n"]) for s in summaries} == expected


def test_list_json_fields(store, capsys):
    directory, ids = store
    _, out, _ = _run(capsys, "traces", "list", "--dir", str(directory), "--json", "--step", "3")
    (summary,) = json.loads(out)
    assert summary["trace_id"] == ids["failing"]
    assert summary == {**summary, "experiment": "exp", "step": 3, "sample_index": 0,
                       "rollout_n": 0, "validate": False, "reward": 0.5, "turns": 3,
                       "spans": 4, "status": "error", "errors": 1, "name": "rollout_trace"}
    assert summary["duration_ns"] > 0


def test_dir_defaults_to_the_environment(store, capsys, monkeypatch, tmp_path):
    directory, _ = store
    monkeypatch.setenv(ENV_TRACE_DIR, str(directory))
    rc, out, _ = _run(capsys, "traces", "list", "--step", "1")
    assert rc == 0 and len(_rows(out)[1]) == 4
    monkeypatch.delenv(ENV_TRACE_DIR)
    monkeypatch.chdir(tmp_path)  # ./otel_verl_traces does not exist here
    rc, out, err = _run(capsys, "traces", "list")
    assert rc == 1 and out == "" and "no traces at" in err and ENV_TRACE_DIR in err


def test_truncated_store_still_lists_and_says_so(store, capsys):
    directory, _ = store
    (path,) = list(directory.iterdir())
    data = path.read_bytes()
    path.write_bytes(data[:-25])  # the last span's line is cut: the failing trajectory's root
    rc, out, err = _run(capsys, "traces", "list", "--dir", str(directory))
    assert rc == 0 and "skipped 1 truncated line(s)" in err
    _, rows = _rows(out)
    assert len(rows) == 10 and rows[-1]["STATUS"] == "error(1)"
    assert rows[-1]["SPANS"] == "3"  # the cut root is gone; its children remain


def test_progress_is_reported_on_stderr(store, capsys):
    directory, _ = store
    rc, out, err = _run(capsys, "traces", "list", "--dir", str(directory), "--progress")
    assert rc == 0 and "reading traces" in err and len(_rows(out)[1]) == 10
    rc, out, err = _run(capsys, "traces", "list", "--dir", str(directory))
    assert "reading traces" not in err  # small store, not a terminal: quiet by default


# --- show ---------------------------------------------------------------------------------------


def test_show_prints_the_tree_with_truncated_payloads_and_errors(store, capsys):
    directory, ids = store
    trace_id = ids["failing"]
    rc, out, err = _run(capsys, "traces", "show", trace_id[:10].upper(), "--dir", str(directory))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"trace {trace_id}"
    assert lines[1].startswith("trajectory 'rollout_trace' experiment=exp step=3 sample=0 rollout=0")
    assert "reward=0.5 turns=3  4 spans" in lines[1] and lines[1].endswith("error")
    names = [line for line in lines[2:] if "ToolAgentLoop" in line or "rollout_trace" in line
             or "CalculatorTool" in line]
    assert names[0].startswith("rollout_trace")
    assert names[1].startswith("└── ToolAgentLoop.run  [AGENT]")
    assert names[2].startswith("    ├── ToolAgentLoop.generate")
    assert names[3].startswith("    └── CalculatorTool.execute  [TOOL]") and names[3].endswith("ERROR")
    (input_line,) = [line for line in lines if "input: " in line]
    shown = input_line.split("input: ", 1)[1]
    assert shown.endswith("…") and len(shown) == PREVIEW_CHARS
    assert any(line.endswith('output: {"answer": "s0r0"}') for line in lines)
    assert any(line.endswith("!! ZeroDivisionError: division by zero") for line in lines)
    assert "Traceback" not in out  # stack traces only with --full
    assert "!! status ERROR" not in out  # same text as the exception: said once


def test_show_full_prints_everything(store, capsys):
    directory, ids = store
    rc, out, _ = _run(capsys, "traces", "show", ids["failing"], "--dir", str(directory), "--full")
    assert rc == 0
    assert out.count("tell me a story") == 100  # the whole prompt
    assert "Traceback (most recent call last)" in out and "raise ZeroDivisionError" in out
    assert f"{semconv.ROLLOUT_REWARD} = 0.5" in out


def test_show_json_is_the_nested_tree(store, capsys):
    directory, ids = store
    _, out, _ = _run(capsys, "traces", "show", ids[(2, 1, 0)], "--dir", str(directory), "--json")
    data = json.loads(out)
    assert data["trace_id"] == ids[(2, 1, 0)]
    (trajectory,) = data["trajectories"]
    assert (trajectory["step"], trajectory["sample_index"], trajectory["rollout_n"]) == (2, 1, 0)
    (root,) = trajectory["tree"]
    assert root["name"] == "rollout_trace"
    assert [c["name"] for c in root["children"]] == ["ToolAgentLoop.run"]
    run = root["children"][0]
    assert json.loads(run["attributes"][semconv.INPUT_VALUE]) == {"prompt": LONG_PROMPT}
    assert [c["name"] for c in run["children"]] == ["ToolAgentLoop.generate"]


def test_show_unknown_and_ambiguous_prefixes(store, capsys):
    directory, ids = store
    rc, out, err = _run(capsys, "traces", "show", "zzzz", "--dir", str(directory))
    assert rc == 1 and out == "" and "no trace id starts with 'zzzz'" in err
    # the ids are seeded, so some pair shares its first character: that prefix is ambiguous
    firsts = [i[0] for i in ids.values()]
    shared = next(c for c in firsts if firsts.count(c) > 1)
    rc, out, err = _run(capsys, "traces", "show", shared, "--dir", str(directory))
    assert rc == 2 and out == "" and "ambiguous" in err
    assert sum(1 for i in ids.values() if i.startswith(shared) and i in err) == firsts.count(shared)


# --- usage, demo, replay, entry point -----------------------------------------------------------


def test_usage_errors_return_2(capsys):
    assert main([]) == 2
    assert main(["traces"]) == 2
    assert main(["traces", "list", "--step", "x"]) == 2
    assert "invalid int value" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_demo_dispatches_to_the_rollout_demo(monkeypatch):
    seen = []
    fake = types.ModuleType("otel_verl.demo.run")
    fake.main = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, "otel_verl.demo.run", fake)
    assert main(["demo", "--steps", "2", "--help"]) == 7
    assert seen == [["--steps", "2", "--help"]]  # everything after "demo" is the demo's


def test_demo_without_the_extras_says_how_to_install(monkeypatch, capsys):
    def missing(name, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'httpx'", name="httpx")

    monkeypatch.delitem(sys.modules, "otel_verl.demo.run", raising=False)
    monkeypatch.setattr("otel_verl.cli.importlib.import_module", missing)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "No module named 'httpx'" in err and "pip install 'otel-verl[rollout]'" in err


def test_replay_sends_spooled_spans_through_an_exporter(store, capsys):
    directory, ids = store
    rc, out, err = _run(capsys, "traces", "replay", str(directory), "--to", "console")
    assert rc == 0 and "replayed 31 span(s) to console; 0 failed" in err
    assert out.count('"name": "rollout_trace"') == 10
    assert ids["failing"] in out
    rc, _, err = _run(capsys, "traces", "replay", str(directory / "missing"), "--to", "console")
    assert rc == 1 and "nothing to replay" in err


def test_entry_point_runs_as_a_program(store):
    directory, _ = store
    result = subprocess.run(
        [sys.executable, "-m", "otel_verl.cli", "traces", "list", "--dir", str(directory),
         "--validate"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2 and " 9 " in result.stdout.splitlines()[1]
    script = Path(sys.executable).with_name("otel-verl")  # [project.scripts] in this venv
    if script.exists():
        result = subprocess.run([str(script), "traces", "list", "--dir", str(directory)],
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0 and len(result.stdout.splitlines()) == 11
    pipe = subprocess.run(  # `| head -1` closes the pipe early: no traceback
        f"{sys.executable} -m otel_verl.cli traces list --dir {directory} | head -1",
        shell=True, capture_output=True, text=True, timeout=120, check=False,
    )
    assert pipe.stdout.startswith("TRACE") and "Traceback" not in pipe.stderr


# --- end to end with the real API ---------------------------------------------------------------


async def test_real_api_to_file_backend_to_cli(tmp_path, capsys):
    """RolloutTraceConfig(backend="file") -> FileSpanExporter -> store -> otel-verl traces."""
    from otel_verl import RolloutTraceConfig, record_reward, rollout_trace_attr, rollout_trace_op

    class AgentLoop:
        @rollout_trace_op
        async def run(self, prompt, **kwargs):
            await self.generate(prompt)
            if kwargs.get("explode"):
                raise RuntimeError("tool server down")
            return {"answer": prompt.upper()}

        @rollout_trace_op
        async def generate(self, prompt):
            return "tokens"

    directory = tmp_path / "store"
    RolloutTraceConfig.init("proj", "e2e", backend="file", trace_dir=str(directory))
    for sample in (0, 1, 2):
        with rollout_trace_attr(sample_index=sample, step=4, rollout_n=1, validate=sample == 2):
            try:
                await AgentLoop().run(f"prompt {sample}", explode=sample == 1)
            except RuntimeError:
                pass
            record_reward(float(sample))
    assert RolloutTraceConfig.flush()
    RolloutTraceConfig.shutdown()

    rc, out, _ = _run(capsys, "traces", "list", "--dir", str(directory), "--no-validate")
    assert rc == 0
    _, rows = _rows(out)
    assert [(r["EXPERIMENT"], r["STEP"], r["SAMPLE"], r["ROLLOUT"], r["REWARD"], r["SPANS"],
             r["STATUS"]) for r in rows] == [
        ("e2e", "4", "0", "1", "0", "3", "ok"),
        ("e2e", "4", "1", "1", "1", "3", "error(1)"),
    ]
    rc, out, _ = _run(capsys, "traces", "list", "--dir", str(directory), "--json", "--validate")
    (validated,) = json.loads(out)
    assert validated["sample_index"] == 2 and validated["reward"] == 2.0

    failing = next(r["TRACE"] for r in rows if r["SAMPLE"] == "1")
    rc, out, _ = _run(capsys, "traces", "show", failing, "--dir", str(directory))
    assert rc == 0
    assert "AgentLoop.run" in out and "AgentLoop.generate" in out
    assert '"prompt": "prompt 1"' in out.replace('":"', '": "')  # the bound argument
    assert "!! RuntimeError: tool server down" in out


# --- compare ------------------------------------------------------------------------------------


def test_compare_puts_two_trajectories_side_by_side(store, capsys):
    directory, ids = store
    rc, out, _ = _run(capsys, "traces", "compare", ids[(1, 0, 0)][:16], ids["failing"][:16],
                      "--dir", str(directory))
    assert rc == 0
    summary = {line.split()[0]: line for line in out.splitlines()[:12] if line.strip()}
    assert "≠" in summary["step"] and "≠" not in summary["sample_index"]
    assert "≠" not in summary["reward"] and "≠" in summary["status"]
    assert '{"answer":"s0r0"}' in out.replace(" ", "") and "CalculatorTool.execute" in out
    assert "ERROR ZeroDivisionError" in out  # the failing step shows its error as its output
    assert out.rstrip().endswith("steps differ (name or output)")
    assert "1 of 3 steps differ" in out  # only the extra failing tool step; the rest is equal


def test_compare_differences_only_and_json(store, capsys):
    directory, ids = store
    rc, out, _ = _run(capsys, "traces", "compare", ids[(1, 0, 0)][:16], ids[(2, 0, 0)][:16],
                      "--dir", str(directory), "--differences-only")
    assert rc == 0 and "0 of 2 steps differ" in out and "ToolAgentLoop.run" not in out
    rc, out, _ = _run(capsys, "traces", "compare", ids[(1, 0, 0)][:16], ids[(1, 1, 1)][:16],
                      "--dir", str(directory), "--json")
    doc = json.loads(out)
    assert doc["a"]["sample_index"] == 0 and doc["b"]["sample_index"] == 1
    assert doc["steps"][0]["a"]["output"] != doc["steps"][0]["b"]["output"]


def test_compare_unknown_trace(store, capsys):
    directory, ids = store
    rc, _, err = _run(capsys, "traces", "compare", ids[(1, 0, 0)][:16], "ffffffffffff",
                      "--dir", str(directory))
    assert rc == 1 and "no trace id starts with" in err


@pytest.mark.parametrize("flag", ["--dir", "--trace-dir"])
def test_every_store_command_takes_dir_and_trace_dir(store, capsys, monkeypatch, tmp_path, flag):
    directory, ids = store
    rc, out, _ = _run(capsys, "traces", "list", flag, str(directory))
    assert rc == 0 and len(_rows(out)[1]) == 10
    rc, out, _ = _run(capsys, "traces", "show", ids["failing"][:16], flag, str(directory))
    assert rc == 0 and "CalculatorTool.execute" in out
    rc, out, _ = _run(capsys, "traces", "compare", ids[(1, 0, 0)][:16], ids[(1, 0, 1)][:16],
                      flag, str(directory))
    assert rc == 0 and out
    report = tmp_path / "r.html"
    rc, _, _ = _run(capsys, "report", flag, str(directory), "-o", str(report))
    assert rc == 0 and report.is_file()
    served = {}

    def serve(index, host, port, **kwargs):  # `ui` itself would serve until interrupted
        served.update(trace_dir=index.trace_dir, host=host, **kwargs)

    monkeypatch.setattr("otel_verl.ui.server.serve", serve)
    rc, _, _ = _run(capsys, "ui", flag, str(directory), "--port", "0", "--allow-host", "a.lan",
                    "--allow-host", "b.lan")
    assert rc == 0 and served["trace_dir"] == str(directory)
    assert served["allowed_hosts"] == ["a.lan", "b.lan"]


# --- the lake commands' refusals ----------------------------------------------------------------

_WITHOUT = ("import sys\nfor name in {blocked!r}: sys.modules[name] = None  # not installed\n"
            "from otel_verl.cli import main\nsys.exit(main({argv!r}))")


@pytest.mark.parametrize("blocked", [("duckdb",), ("pyarrow",)])
def test_sql_and_compact_without_the_lake_extra_say_so(store, tmp_path, blocked):
    """Without DuckDB, or with DuckDB but without pyarrow (the sql command used to crash there:
    it checked for DuckDB alone), both commands say what to install and exit 2; a missing store
    is 1, as before."""
    directory, _ = store
    for argv, rc, said in (
            (["sql", "SELECT 1", "--dir", str(directory)], 2, "otel-verl sql: this needs the lake extra"),
            (["compact", "--dir", str(directory)], 2, "otel-verl compact: this needs the lake extra")):
        result = subprocess.run([sys.executable, "-c", _WITHOUT.format(blocked=blocked, argv=argv)],
                                capture_output=True, text=True, timeout=120, check=False)
        assert (result.returncode, result.stdout) == (rc, ""), result.stderr
        assert said in result.stderr and "Traceback" not in result.stderr
    for command in ("sql", "compact"):
        argv = [command, *(["SELECT 1"] if command == "sql" else []), "--dir",
                str(tmp_path / "nothing")]
        assert _run_quiet(argv) == (1, f"otel-verl: no traces at {tmp_path / 'nothing'}")


def _run_quiet(argv):
    result = subprocess.run([sys.executable, "-m", "otel_verl.cli", *argv], capture_output=True,
                            text=True, timeout=120, check=False)
    return result.returncode, result.stderr.split(" (set --dir")[0].strip()


def test_list_through_the_lake_refuses_a_step_beyond_64_bits(store, capsys):
    directory, _ = store
    rc, out, err = _run(capsys, "traces", "list", "--dir", str(directory), "--step", str(2**70))
    assert (rc, out) == (2, "") and "step 1180591620717411303424 is out of range" in err
