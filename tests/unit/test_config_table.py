"""One row per option: ``TraceConfig``'s fields carry each option's default, type, parser,
environment names, verl keys and doc line; the user's table (docs/configuration.md) is generated
from them and cannot drift."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from otel_verl import _config, _env
from otel_verl._config import OPTIONS, TraceConfig, options_markdown, resolve_config

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
START, END = "<!-- options-table:", "<!-- /options-table -->"


def _between(text: str, start: str, end: str) -> str:
    begin = text.index("\n", text.index(start)) + 1
    return text[begin:text.index(end)]


def test_the_page_holds_the_generated_table():
    expected = options_markdown()
    assert _between(PAGE.read_text(encoding="utf-8"), START, END) == expected, (
        "docs/configuration.md's options table is out of date; put this between its markers:\n"
        + expected)


def test_every_field_but_chosen_is_an_option_and_its_default_is_the_fields():
    fields = [f for f in dataclasses.fields(TraceConfig) if f.name != "chosen"]
    assert [f.name for f in fields] == [option.name for option in OPTIONS]
    defaults = TraceConfig()
    for field, option in zip(fields, OPTIONS, strict=True):
        assert option.default == getattr(defaults, option.name) == field.default
        assert option.type == str(field.type)
        assert option.doc and "\n" not in option.doc
        assert option.verl[0] == _config.VERL_TRACE_PREFIX + option.name
    assert resolve_config({}, None, {}) == defaults  # no source: exactly the rows' defaults


@pytest.mark.parametrize("option", OPTIONS, ids=lambda option: option.name)
def test_each_default_is_a_value_its_own_parser_accepts(option):
    assert option.parse(option.default) == option.default


def test_every_environment_name_is_a_documented_constant_and_every_one_of_ours_is_read():
    constants = {value for name, value in vars(_env).items() if name.isupper()}
    names = [name for option in OPTIONS for name in option.env_names]
    assert set(names) <= constants
    assert len(names) == len(set(names)), "one environment name sets one option"
    ours = {value for value in constants if value.startswith("OTEL_VERL_")}
    assert ours - set(names) == {_env.OTEL_VERL_CONFIG}  # the worker's whole configuration


def test_the_table_has_one_row_of_six_cells_per_option():
    lines = options_markdown().splitlines()
    assert len(lines) == 2 + len(OPTIONS)
    for line, option in zip(lines[2:], OPTIONS, strict=True):
        cells = re.split(r"(?<!\\)\|", line)[1:-1]  # a pipe escaped as \| stays in its cell
        assert len(cells) == 6, line
        assert cells[0].strip() == f"`{option.name}`"
        assert cells[2].strip() == option.shown_default


def test_shown_defaults_say_the_value_and_the_note():
    by_name = {option.name: option for option in OPTIONS}
    assert by_name["max_queue_bytes"].shown_default == "268435456 (256 MiB)"
    assert by_name["max_spool_bytes"].shown_default == "1073741824 (1 GiB)"
    assert by_name["max_field_bytes"].shown_default == "65536"
    assert by_name["tail_keep"].shown_default == "empty (off)"
    assert by_name["otlp_endpoint"].shown_default == "`null` (the OTLP exporter's own)"
    assert by_name["redact"].shown_default == "`true`"
    assert by_name["schedule_delay_s"].shown_default == "1.0"


def test_standard_variables_read_with_their_own_parser_are_on_their_row():
    by_name = {option.name: option for option in OPTIONS}
    assert by_name["schedule_delay_s"].env_names == (_env.OTEL_BSP_SCHEDULE_DELAY,)
    assert by_name["backend"].env_names == (_env.OTEL_VERL_BACKEND, _env.OTEL_TRACES_EXPORTER)
    assert resolve_config({}, None, {"OTEL_BSP_SCHEDULE_DELAY": "250"}).schedule_delay_s == 0.25


@pytest.mark.parametrize("environ, expected", [
    ({}, "./otel_verl_traces"),
    ({"OTEL_VERL_TRACE_DIR": ""}, "./otel_verl_traces"),
    ({"OTEL_VERL_TRACE_DIR": "/data/t"}, "/data/t"),
])
def test_the_trace_dir_is_read_in_one_place(environ, expected, monkeypatch):
    """The config, the file exporter and the CLI (``resolve_trace_dir``) agree."""
    from otel_verl.exporters import _file_exporter

    assert _config.trace_dir_from_env(environ) == expected
    assert resolve_config({}, None, environ).trace_dir == expected
    monkeypatch.delenv("OTEL_VERL_TRACE_DIR", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert _file_exporter.resolve_trace_dir() == os.path.abspath(expected)
    assert _file_exporter.DEFAULT_TRACE_DIR == _config.DEFAULT_TRACE_DIR
