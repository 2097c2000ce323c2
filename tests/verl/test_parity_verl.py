"""verl's own rollouts carry a policy version and pass parity (issue 22), under unchanged verl.

verl builds the worker, ``ToolAgentLoop``, the parser, the tool and ``LLMServerClient`` from its own
config (``_harness``); only the server actor is a stand-in, which here keeps the weights' version
the way verl's vLLM/SGLang servers do (``set_global_steps`` at each weight sync, the number in
every reply's ``extra_fields["global_steps"]``). Both trainers: the legacy ``AgentLoopWorker``
(the trainer consumes the ``DataProto`` it returns) and the v1 ``AgentLoopWorkerTQ`` (it consumes
what goes into TransferQueue). The trace is checked against the integration's own records
(content ids, ``<trace_dir>/parity/``) and against the very batch the trainer got.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import _harness as h
import numpy as np
import pytest

from otel_verl import semconv
from otel_verl.cli import main
from otel_verl.integrations.verl import _agent_loop
from otel_verl.integrations.verl import _parity as verl_parity
from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex
from otel_verl.store._parity import check, load_consumed

STEP = 7


class VersionedServer(h.FakeServer):
    """The harness's server plus verl's version keeping (``vllm_async_server.set_global_steps``)."""

    def __init__(self, tokenizer: Any, global_steps: int) -> None:
        super().__init__(tokenizer)
        self.global_steps = global_steps

    async def _generate(self, **kwargs: Any) -> Any:
        out = await super()._generate(**kwargs)
        out.extra_fields = {"global_steps": self.global_steps}
        return out


def _flush() -> None:
    from verl.utils.rollout_trace import RolloutTraceConfig

    assert RolloutTraceConfig.flush()
    assert verl_parity.flush_all()


def _rows_of_dataproto(output: Any, batch: Any) -> list[dict]:
    """The legacy trainer's batch as dataset rows: unpadded prompt/response, mask, reward."""
    plen = output.batch["prompts"].shape[1]
    seen: dict[Any, int] = {}
    rows = []
    for i in range(len(output)):
        attention = output.batch["attention_mask"][i]
        prompt = output.batch["prompts"][i][attention[:plen].bool()].tolist()
        keep = attention[plen:].bool()
        sample = batch.non_tensor_batch["index"][i]
        n = seen[sample] = seen.get(sample, -1) + 1
        rows.append({"step": STEP, "sample_index": sample, "rollout_n": n, "validate": False,
                     "prompt_ids": prompt,
                     "response_ids": output.batch["responses"][i][keep].tolist(),
                     "response_mask": output.batch["response_mask"][i][keep].tolist(),
                     "reward": float(output.batch["rm_scores"][i].sum()),
                     "num_turns": int(output.non_tensor_batch["__num_turns__"][i]),
                     "policy_version_min": output.non_tensor_batch["min_global_steps"][i],
                     "policy_version_max": output.non_tensor_batch["max_global_steps"][i]})
    return rows


def _write(rows: list[dict], path: Path) -> str:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, default=lambda v: v.item()) + "\n")
    return str(path)


def _check_versions(spans: list[dict], version: int, trajectories: int) -> None:
    calls = [s for s in spans if s["name"] == "LLMServerClient.generate"]
    assert len(calls) == 2 * trajectories  # two turns each (tool call, answer)
    assert {s["attributes"][semconv.RL_POLICY_VERSION] for s in calls} == {version}
    roots = [s["attributes"] for s in spans if s["attributes"].get(semconv.OTEL_VERL_TRAJECTORY)]
    assert len(roots) == trajectories
    for attrs in roots:
        assert attrs[semconv.RL_POLICY_MIN_VERSION] == attrs[semconv.RL_POLICY_MAX_VERSION] == version
        assert attrs[semconv.RL_POLICY_STALENESS] == STEP - 1 - version


def test_legacy_trainer_rollouts_pass_parity_and_carry_their_policy_version(tiny_model, tmp_path):
    import otel_verl

    otel_verl.RolloutTraceConfig.init("verl_it", "exp_it", backend="file")
    config = h.compose_config(h.base_overrides(tiny_model, h.write_tool_config(tmp_path),
                                               {"backend": "file"}))
    worker, server, _ = h.make_worker(config)
    versioned = VersionedServer(server.tokenizer, STEP - 1)
    worker.llm_client = h.make_client(config, versioned)
    batch = h.make_batch([0, 1], step=STEP, n=2)
    output = asyncio.run(worker.generate_sequences(batch))
    _flush()
    trace_dir = tmp_path / "traces"
    spans = list(read_spans(trace_dir))
    _check_versions(spans, STEP - 1, 4)
    # verl's own record of the versions, in the batch the trainer gets
    assert list(output.non_tensor_batch["min_global_steps"]) == [STEP - 1] * 4

    records = load_consumed(trace_dir)  # the integration's content-id records
    assert len(records) == 4 and all("prompt_ids" not in r for r in records)
    assert all(r["min_version"] == r["max_version"] == STEP - 1 for r in records)
    reports = check(spans, ContentIndex.load(trace_dir), records, max_staleness=0)
    assert len(reports) == 4
    assert [r.differences for r in reports] == [[]] * 4
    # and against the DataProto the trainer consumed (padding removed)
    dataset = _write(_rows_of_dataproto(output, batch), tmp_path / "batch.jsonl")
    reports = check(spans, ContentIndex.load(trace_dir), load_consumed(dataset))
    assert [r.differences for r in reports] == [[]] * 4
    # the check can fail: one trained reward changed is found, in that trajectory only
    rows = _rows_of_dataproto(output, batch)
    rows[1]["reward"] = rows[1]["reward"] + 1.0
    reports = check(spans, ContentIndex.load(trace_dir),
                    load_consumed(_write(rows, tmp_path / "bad.jsonl")))
    assert sorted(d.kind for r in reports for d in r.differences) == ["reward"]

    # exported as data: Hugging Face datasets loads the JSONL and the Parquet; the token ids are
    # the trainer's, the versions the server's
    import datasets

    assert main(["traces", "export", "--dir", str(trace_dir), "-o", str(tmp_path / "x.jsonl")]) == 0
    assert main(["traces", "export", "--dir", str(trace_dir), "-o",
                 str(tmp_path / "x.parquet")]) == 0
    trained = {(r["sample_index"], r["rollout_n"]): r for r in _rows_of_dataproto(output, batch)}
    for name, path in (("json", "x.jsonl"), ("parquet", "x.parquet")):
        loaded = datasets.load_dataset(name, data_files=str(tmp_path / path), split="train")
        assert len(loaded) == 4
        for row in loaded:
            want = trained[(row["sample_index"], row["rollout_n"])]
            assert row["prompt_ids"] == want["prompt_ids"]
            assert row["response_ids"] == want["response_ids"]
            assert row["response_mask"] == want["response_mask"]
            assert row["policy_versions"] == [STEP - 1, STEP - 1]
            assert row["messages"][0]["role"] == "user"


tq_module = pytest.importorskip("verl.trainer.ppo.v1.agent_loop_tq",
                                reason="needs TransferQueue (requirements/verl.txt)")


class RecordingTransferQueue:
    """The ``transfer_queue`` calls of AgentLoopWorkerTQ; keeps the fields the trainer reads."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def init(self) -> None:
        return None

    async def async_kv_put(self, key: str, partition_id: str, tag: dict[str, Any]) -> None:
        return None

    async def async_kv_batch_put(self, keys: list[str], fields: Any, tags: list[dict],
                                 partition_id: str) -> None:
        for i, (key, tag) in enumerate(zip(keys, tags, strict=True)):
            self.rows.append({"key": key, "tag": tag, "prompts": fields["prompts"][i],
                              "responses": fields["responses"][i],
                              "response_mask": fields["response_mask"][i],
                              "rm_scores": fields["rm_scores"][i],
                              "num_turns": fields["num_turns"][i]})


def _tensor_list(value: Any) -> list[int]:
    value = getattr(value, "data", value)
    return [int(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]


def test_v1_trainer_rollouts_pass_parity_and_carry_their_policy_version(tiny_model, tmp_path,
                                                                        monkeypatch):
    from test_agent_loop_v1 import _tq_batch
    from transformers import AutoTokenizer

    fake = RecordingTransferQueue()
    monkeypatch.setattr(tq_module, "tq", fake)
    overrides = [*h.base_overrides(tiny_model, h.write_tool_config(tmp_path), {"backend": "file"}),
                 "actor_rollout_ref.rollout.n=2", "trainer.use_v1=True"]
    config = h.compose_config(overrides)
    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
    cls = _agent_loop._actor_class(tq_module.AgentLoopWorkerTQ)
    # the v1 trainer's async mode: these weights are one sync behind (version 5 at step 7)
    worker = cls(config, h.make_client(config, VersionedServer(tokenizer, STEP - 2)),
                 reward_loop_worker_handles=[h.FakeRewardHandle(tokenizer)])

    async def drive() -> None:
        await worker.generate_sequences(_tq_batch([0, 1], STEP))
        while worker.background_tasks:
            await asyncio.gather(*list(worker.background_tasks))

    asyncio.run(drive())
    _flush()
    trace_dir = tmp_path / "traces"
    spans = list(read_spans(trace_dir))
    _check_versions(spans, STEP - 2, 4)
    assert {r["tag"]["min_global_steps"] for r in fake.rows} == {STEP - 2}
    records = load_consumed(trace_dir)
    reports = check(spans, ContentIndex.load(trace_dir), records)
    assert len(reports) == 4 and [r.differences for r in reports] == [[]] * 4
    # staleness 1 is what this run has: a limit of 0 says so for every trajectory
    stale = check(spans, ContentIndex.load(trace_dir), records, max_staleness=0)
    assert {d.kind for r in stale for d in r.differences} == {"stale"}
    # against what went into TransferQueue (the v1 trainer's input), matched by session
    rows = []
    for row in fake.rows:
        uid, session, _ = row["key"].rsplit("_", 2)
        rows.append({"step": STEP, "sample_index": int(uid.split("-")[1]),
                     "rollout_n": int(session), "validate": False,
                     "prompt_ids": _tensor_list(row["prompts"]),
                     "response_ids": _tensor_list(row["responses"]),
                     "response_mask": _tensor_list(row["response_mask"]),
                     "reward": float(np.asarray(getattr(row["rm_scores"], "data",
                                                        row["rm_scores"])).sum()),
                     "num_turns": int(np.asarray(getattr(row["num_turns"], "data",
                                                         row["num_turns"]))),
                     "policy_version_min": row["tag"]["min_global_steps"],
                     "policy_version_max": row["tag"]["max_global_steps"]})
    reports = check(spans, ContentIndex.load(trace_dir),
                    load_consumed(_write(rows, tmp_path / "tq.jsonl")))
    assert len(reports) == 4 and [r.differences for r in reports] == [[]] * 4
