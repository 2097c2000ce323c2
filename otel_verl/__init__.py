"""otel_verl: OpenTelemetry tracing for RL post-training rollouts, a drop-in for verl's
``verl.utils.rollout_trace``.

Usage::

    from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op

    RolloutTraceConfig.init("my_project", "exp1", "file")     # file | otlp | weave | console | none

    class MyAgentLoop:
        @rollout_trace_op
        async def run(self, sampling_params, **row): ...

    with rollout_trace_attr(step=1, sample_index=3, rollout_n=0):
        await MyAgentLoop().run(params, **row)

Configuration: explicit argument > verl/Hydra key (``actor_rollout_ref.rollout.trace.*``,
``trainer.*``) > environment (``OTEL_*``, ``OTEL_VERL_*``) > default; see docs/configuration.md.
"""

from otel_verl import semconv
from otel_verl._capture import payload_json, scrub_text, set_payload
from otel_verl._config import ConfigError, TraceConfig
from otel_verl._decorator import rollout_trace_op
from otel_verl._evaluations import record_reward_component
from otel_verl._facade import RolloutTraceConfig
from otel_verl._policy import set_policy_version
from otel_verl._propagation import inject_context, traceparent_headers, use_context
from otel_verl._sampling import TrajectorySampler
from otel_verl._trajectory import (
    get_tracer,
    get_tracer_provider,
    is_recording,
    record_reward,
    rollout_trace_attr,
    set_trajectory_attribute,
    set_trajectory_input,
    set_trajectory_output,
)
from otel_verl.exporters._detect import register_detector
from otel_verl.semconv import SpanKindName

__all__ = [
    "ConfigError",
    "RolloutTraceConfig",
    "SpanKindName",
    "TraceConfig",
    "TrajectorySampler",
    "get_tracer",
    "get_tracer_provider",
    "inject_context",
    "is_recording",
    "payload_json",
    "record_reward",
    "record_reward_component",
    "register_detector",
    "rollout_trace_attr",
    "rollout_trace_op",
    "scrub_text",
    "semconv",
    "set_payload",
    "set_policy_version",
    "set_trajectory_attribute",
    "set_trajectory_input",
    "set_trajectory_output",
    "traceparent_headers",
    "use_context",
]
__version__ = "0.1.0"
