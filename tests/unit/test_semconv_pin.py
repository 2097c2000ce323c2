"""The Weave exporter copies otel_verl's attribute keys (it does not import otel_verl): every copy
must equal ``otel_verl.semconv``'s value, so a key renamed on one side cannot silently stop the
exporter from reading what otel_verl writes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from _modules import load_file

from otel_verl import _env, semconv

CONVENTIONS = (Path(__file__).resolve().parents[2] / "exporters" / "weave" / "src"
               / "otel_weave_exporter" / "_conventions.py")
#: the keys the Weave translation depends on: they must be in both modules, under these names
PINNED = ("ROLLOUT_STEP", "ROLLOUT_SAMPLE_INDEX", "ROLLOUT_ROLLOUT_N", "ROLLOUT_VALIDATE",
          "ROLLOUT_EXPERIMENT_NAME", "OTEL_VERL_TRAJECTORY", "OTEL_VERL_TRAJECTORY_CHILD",
          "OTEL_VERL_TRAJECTORY_OP", "CONTENT_ID", "CONTENT_LEN", "CONTENT_BASE_ID",
          "CONTENT_BASE_LEN", "CONTENT_DELTA_LEN", "INPUT_VALUE", "OUTPUT_VALUE",
          "OPENINFERENCE_SPAN_KIND", "GEN_AI_OPERATION_NAME", "GEN_AI_USAGE_INPUT_TOKENS",
          "GEN_AI_USAGE_OUTPUT_TOKENS", "GEN_AI_CONVERSATION_ID")
#: key prefixes otel_verl (or OpenInference/GenAI through otel_verl) writes
OURS = ("rollout.", "otel_verl.", "gen_ai.", "input.", "output.", "openinference.")


def _conventions() -> ModuleType:
    """The exporter's module, loaded from its file (installed or not)."""
    return load_file(CONVENTIONS, "_weave_conventions_under_test")


def _constants(module: ModuleType) -> dict[str, object]:
    return {name: value for name, value in vars(module).items() if name.isupper()}


def test_every_key_copied_under_semconvs_name_has_semconvs_value():
    copied, ours = _constants(_conventions()), _constants(semconv)
    shared = sorted(set(copied) & set(ours))
    assert set(PINNED) <= set(shared), f"no longer in both: {sorted(set(PINNED) - set(shared))}"
    assert {name: copied[name] for name in shared} == {name: ours[name] for name in shared}


def test_every_key_of_ours_the_exporter_reads_is_one_otel_verl_writes():
    written = {value for value in _constants(semconv).values() if isinstance(value, str)}
    prefixes = {value for name, value in _constants(_conventions()).items()
                if name.endswith("_PREFIX")}
    read = {value for value in _constants(_conventions()).values()
            if isinstance(value, str) and value.startswith(OURS) and value not in prefixes}
    assert read - written == set()
    for prefix in prefixes & {"rollout.", "otel_verl.content."}:
        assert any(key.startswith(prefix) for key in written), prefix


def test_the_values_it_compares_against_are_semconvs():
    conventions = _conventions()
    assert conventions.OPENINFERENCE_KIND_LLM == semconv.SpanKindName.LLM
    assert conventions.GEN_AI_LLM_OPERATIONS == {
        semconv.GenAIOperation.CHAT, semconv.GenAIOperation.TEXT_COMPLETION,
        semconv.GenAIOperation.GENERATE_CONTENT}
    assert conventions.CONSUMED_KEYS <= {value for value in _constants(semconv).values()
                                         if isinstance(value, str)} | {
        conventions.WANDB_DISPLAY_NAME}


def test_environment_names_shared_with_otel_verl_match():
    conventions = _conventions()
    assert conventions.ENV_KEEP_TRAJECTORY == _env.OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY
    assert conventions.ENV_THREADS == _env.OTEL_EXPORTER_WEAVE_THREADS
    assert conventions.WANDB_RUN_ID == _env.WANDB_RUN_ID
