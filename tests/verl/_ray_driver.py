"""A verl-like driver: start Ray, run verl's AgentLoopWorker as a Ray actor (as verl's
AgentLoopManager does: ``ray.remote(AgentLoopWorker)``). The actor's process imports verl on its own.

Argument: JSON {"model", "tmp", "mode"}. mode "install": ``install()`` in the driver (the bootstrap
on PYTHONPATH installs otel_verl in the workers). mode "setup_hook": nothing in the driver; Ray's
``runtime_env={"worker_process_setup_hook": "otel_verl.integrations.verl.install"}`` (what
``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=...`` gives verl's ray.init); only a
probe task runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

args = json.loads(sys.argv[1])
runtime_env: dict = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}
if args["mode"] == "install":
    from otel_verl.integrations.verl import install

    install()  # before verl and Ray: sets the worker environment Ray's processes inherit
else:
    runtime_env["worker_process_setup_hook"] = "otel_verl.integrations.verl.install"

import ray  # noqa: E402  (after install(): Ray inherits its environment)

#: Ray 2.60 waits a fixed 30 s for its node to register (ray/_private/node.py, no setting); on a
#: loaded 2-core machine that can pass. Only that failure is retried, once; anything else raises.
SLOW_START = "The current node timed out during startup"
for attempt in (1, 2):
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env=runtime_env)
        break
    except Exception as exc:
        if SLOW_START not in str(exc) or attempt == 2:
            raise
        sys.stderr.write(f"ray.init: {exc}; retrying once\n")
        ray.shutdown()
try:
    import _harness as h
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    @ray.remote(num_cpus=0)
    def probe() -> dict:
        import verl.experimental.agent_loop.tool_agent_loop as tal

        return {"pid": os.getpid(), "routed": bool(getattr(tal.ToolAgentLoop.run,
                                                           "__otel_verl_verl__", False))}

    if args["mode"] != "install":
        print("RESULT " + json.dumps({"driver_pid": os.getpid(),
                                      "driver_has_otel_verl": "otel_verl" in sys.modules,
                                      "probe": ray.get(probe.remote(), timeout=120)}))
        sys.exit(0)
    tmp = Path(args["tmp"])
    config = h.compose_config(h.base_overrides(Path(args["model"]), h.write_tool_config(tmp),
                                               {"backend": "file",
                                                "max_samples_per_step_per_worker": 2}))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
    server = h.FakeServer(tokenizer)
    worker = ray.remote(num_cpus=1)(AgentLoopWorker).remote(
        config, h.make_client(config, server),
        reward_loop_worker_handles=[h.FakeRewardHandle(tokenizer)])

    out = ray.get(worker.generate_sequences.remote(h.make_batch([0, 1, 2, 3], step=9, n=2)),
                  timeout=240)
    flushed = ray.get(worker.__ray_call__.remote(
        lambda self: __import__("verl.utils.rollout_trace", fromlist=["x"])
        .RolloutTraceConfig.flush(10.0)), timeout=60)
    result = {"driver_pid": os.getpid(), "probe": ray.get(probe.remote(), timeout=120),
              "scores": out.batch["rm_scores"].sum(-1).tolist(), "flushed": flushed}
finally:
    ray.shutdown()
print("RESULT " + json.dumps(result))
