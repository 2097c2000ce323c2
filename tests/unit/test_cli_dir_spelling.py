"""One spelling for the store directory on every command: ``--dir`` (``--trace-dir`` an alias).

``test_cli.test_every_store_command_takes_dir_and_trace_dir`` runs each command with both
spellings over a real store; here the usage line each command prints must name ``--dir``, and no
message tells the user to ``set --trace-dir``.
"""

from __future__ import annotations

import argparse

import pytest

from otel_verl import cli

STORE_COMMANDS = (("traces", "list"), ("traces", "show"), ("traces", "compare"), ("ui",),
                  ("report",))


def _subparser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = cli._parser()
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("path", STORE_COMMANDS, ids=" ".join)
def test_usage_names_dir_first_and_accepts_trace_dir(path):
    parser = _subparser(path)
    usage = parser.format_usage()
    assert "--dir DIR" in usage and "--trace-dir" not in usage, usage
    action = next(a for a in parser._actions if a.dest == "dir")
    assert action.option_strings == ["--dir", "--trace-dir"]


def test_module_docstring_and_messages_say_dir():
    assert cli.__doc__ is not None
    for line in cli.__doc__.splitlines():
        if line.strip().startswith("otel-verl "):
            assert "--trace-dir" not in line, line
    with open(cli.__file__, encoding="utf-8") as handle:
        assert "set --trace-dir" not in handle.read()


def test_missing_store_message_names_dir(tmp_path, capsys):
    rc = cli.main(["report", "--trace-dir", str(tmp_path / "absent"), "-o",
                   str(tmp_path / "r.html")])
    assert rc == 1
    assert "set --dir or $OTEL_VERL_TRACE_DIR" in capsys.readouterr().err
