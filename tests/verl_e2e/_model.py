"""The end-to-end run's policy: the project's tiny model, fine-tuned briefly to call the tool.

A random-weight tiny model never emits ``<tool_call>``, so every rollout runs to the length cap,
scores the same and gives GRPO nothing to learn from (zero advantages, zero gradient, no tool
spans). A short supervised fine-tune on conversations in the exact format verl's ``ToolAgentLoop``
renders (the chat template with the calculator's schema: question, hermes tool call, tool response,
answer) makes it call the tool most of the time; sampling at temperature 1 keeps the group's
answers different, so the graded reward (``shims/e2e_reward.py``) varies within a group.

Deterministic (seeded), CPU, about a minute on 2 cores; cached next to the tiny model by a stamp
that includes this file's recipe version.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

RECIPE = "tool-sft-v1"
STEPS = 200
BATCH = 16
POOL = 256  # distinct conversations, rendered once
LR = 3e-3

#: the calculator's schema as verl hands it to the chat template (tools.yaml in _run.py)
TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the expression"}},
            "required": ["expression"],
        },
    },
}


def question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}? Use the calculator."


def solve(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    a, b, op = rng.randint(1, 99), rng.randint(1, 99), rng.choice("+-*")
    result = solve(a, op, b)
    call = {"type": "function", "function": {"name": "calculator",
                                             "arguments": {"expression": f"{a}{op}{b}"}}}
    return [
        {"role": "user", "content": question(a, op, b)},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": str(result)},
        {"role": "assistant", "content": f"The answer is {result}."},
    ]


def _fine_tune(model_dir: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model: more threads only contend on a shared machine
    rng = random.Random(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    pool = []
    for _ in range(POOL):
        ids = tokenizer.apply_chat_template(_conversation(rng), tools=[TOOL_SCHEMA],
                                            tokenize=True, return_dict=False)
        pool.append(list(ids["input_ids"]) if isinstance(ids, dict) else list(ids))
    print(f"tool-sft: {POOL} conversations, {max(len(r) for r in pool)} tokens at most",
          flush=True)
    for step in range(STEPS):
        rows = rng.sample(pool, BATCH)
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % 100 == 0 or step == STEPS - 1:
            print(f"tool-sft step {step} loss {loss.item():.3f}", flush=True)
    model.to(torch.bfloat16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    for name in ("generation_config.json",):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out_dir / name)


def tool_model(cache_root: Path | None = None) -> Path:
    """The fine-tuned tiny model's directory (built once, then reused)."""
    from otel_verl.demo.tiny_model import DEFAULT_CACHE_DIR, build_tiny_model

    base = Path(build_tiny_model())
    root = cache_root or DEFAULT_CACHE_DIR.parent
    target = root / f"{base.name}-{RECIPE}"
    stamp = target / "otel_verl_tool_sft.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("recipe") == RECIPE:
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        _fine_tune(base, tmp)
        (tmp / stamp.name).write_text(json.dumps({"recipe": RECIPE, "steps": STEPS}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":  # pragma: no cover
    print(tool_model())
