"""Build a tiny random Qwen2 model and a ChatML tokenizer locally (nothing from a model hub).

Usage::

    from otel_verl.demo.tiny_model import build_tiny_model
    path = build_tiny_model()            # cached in ~/.cache/otel_verl/tiny-qwen2-v1
    # python -m vllm.entrypoints.openai.api_server --model <path> ...

or ``python -m otel_verl.demo.tiny_model [DIR]``.

Deterministic: the tokenizer is a byte-level BPE trained on a fixed, seeded synthetic corpus (chat
markup, hermes tool calls, arithmetic, answers) with one token per digit and ``<tool_call>``,
``</tool_call>``, ``<tool_response>``, ``</tool_response>`` as single (non-special) tokens, so a
tool call is ~20-45 tokens; the model is ``Qwen2Config(hidden_size=64, intermediate_size=128,
num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=512)`` initialised
with ``torch.manual_seed(0)``, saved in bf16 (head_dim 32: the smallest the vLLM CPU attention
accepts). The chat template renders system, user, assistant (with ``tool_calls`` in hermes form)
and tool messages (as ``<tool_response>`` turns); eos is ``<|im_end|>``.

Needs ``torch``, ``transformers`` and ``tokenizers`` (the engine requirements), imported lazily.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "DEFAULT_CACHE_DIR", "build_tiny_model"]

BUILD_VERSION = "tiny-qwen2-v1"
_STAMP = "otel_verl_tiny_model.json"
DEFAULT_CACHE_DIR = Path(
    os.environ.get("OTEL_VERL_MODEL_CACHE", Path.home() / ".cache" / "otel_verl")
) / BUILD_VERSION

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB_SIZE = 512

CHAT_TEMPLATE = (
    # no whitespace control anywhere: every newline below is one the model sees
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "You may call these tools:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    'Call a tool as <tool_call>{"name": NAME, "arguments": ARGS}</tool_call><|im_end|>\n'
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": '
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}"
    "}</tool_call>"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>tool\n<tool_response>{{ message.content }}</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus(seed: int = 0, n: int = 3000) -> list[str]:
    """A fixed synthetic corpus: the texts the demo's rollouts are made of."""
    rng = random.Random(seed)
    words = ["what", "is", "the", "answer", "use", "calculator", "tool", "to", "compute", "please", "result", "of", "sum", "product", "difference", "a", "an", "and", "or", "number", "numbers", "value", "total", "each", "how", "many", "has", "have", "apples", "books", "cost", "costs", "dollars", "tom", "anna", "buys", "sells", "gives", "left", "more", "less", "times"]
    texts = [" ".join(words)]
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        op = rng.choice("+-*")
        expr = f"{a}{op}{b}"
        result = a + b if op == "+" else a - b if op == "-" else a * b
        texts.append(f"<|im_start|>user\nWhat is {a} {op} {b}? Use the calculator.<|im_end|>\n")
        texts.append(
            '<|im_start|>assistant\n<tool_call>{"name": "calculator", "arguments": '
            f'{{"expression": "{expr}"}}}}</tool_call><|im_end|>\n'
        )
        texts.append(
            f"<|im_start|>tool\n<tool_response>{result}</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\nThe answer is {result}.<|im_end|>\n"
        )
        texts.append(f"#### {result}")
        texts.append(" ".join(rng.choice(words) for _ in range(8)))
    return texts


def _train_tokenizer(out_dir: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens(MARKUP_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    if len(fast) > VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {len(fast)} tokens > {VOCAB_SIZE}")
    return int(fast.convert_tokens_to_ids("<|im_end|>"))


def _save_model(out_dir: Path, eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=eos_id).save_pretrained(
        out_dir
    )


def build_tiny_model(cache_dir: str | os.PathLike[str] | None = None, *, force: bool = False) -> Path:
    """Build (or reuse) the tiny model + tokenizer in ``cache_dir``; returns the directory.

    Safe to call from several processes: the build happens in a temporary sibling directory that
    is renamed into place.
    """
    target = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    stamp = target / _STAMP
    if not force and stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("version") == BUILD_VERSION:
                return target
        except ValueError:
            pass
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        eos_id = _train_tokenizer(tmp)
        pad_id = 0  # <|endoftext|> is the first special token
        _save_model(tmp, eos_id, pad_id)
        (tmp / _STAMP).write_text(json.dumps({"version": BUILD_VERSION, "eos_token_id": eos_id}))
        if target.exists():
            shutil.rmtree(target)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race: use its build
            if not (target / _STAMP).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":  # pragma: no cover
    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else None))
