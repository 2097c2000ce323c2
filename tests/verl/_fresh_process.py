"""Run in a fresh interpreter (as a Ray worker would be): imports verl FIRST, never otel_verl.

It builds verl's AgentLoopWorker from verl's config and runs one step, exactly as verl's own code
does in an agent-loop worker. Argument: a JSON object {"model", "tmp", "trace", "late_install"}.
Prints one JSON line with what it saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from verl.experimental.agent_loop import agent_loop  # noqa: F401  (verl first)
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

args = json.loads(sys.argv[1])
loaded_with_verl = "otel_verl" in sys.modules  # the bootstrap brought it in with ``import verl``
if args.get("late_install"):
    from otel_verl.integrations.verl import install

    install(propagate=False)

import _harness as h  # noqa: E402  (after the optional late install)

routed = bool(getattr(ToolAgentLoop.run, "__otel_verl_verl__", False))
tmp = Path(args["tmp"])
config = h.compose_config(h.base_overrides(Path(args["model"]), h.write_tool_config(tmp),
                                           args["trace"]))
worker, server, reward = h.make_worker(config)
asyncio.run(worker.generate_sequences(h.make_batch([0, 1], step=5)))
from verl.utils.rollout_trace import RolloutTraceConfig  # noqa: E402

flush = getattr(RolloutTraceConfig, "flush", None)  # verl's own class has none
if flush is not None:
    flush()
result = {"routed": routed, "otel_verl_loaded": loaded_with_verl,
          "backend": RolloutTraceConfig.get_backend()}
if args.get("report_wandb_run_id"):
    import os

    result["wandb_run_id"] = os.environ.get("WANDB_RUN_ID")
    result["driver_wandb_run_id"] = args.get("driver_wandb_run_id")
if args.get("late_install"):
    from otel_verl.integrations.verl import uninstall

    uninstall()
    import verl.utils.rollout_trace as rt
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop as Again

    result["after_uninstall_routed"] = bool(getattr(Again.run, "__otel_verl_verl__", False))
    result["after_uninstall_module"] = rt.RolloutTraceConfig.__module__
print("RESULT " + json.dumps(result))
