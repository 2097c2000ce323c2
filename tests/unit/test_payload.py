"""Payload capture: never raises, always valid JSON within the cap, secrets redacted."""

import dataclasses
import enum
import json
from collections.abc import Mapping
from datetime import datetime

import numpy as np
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_verl._payload import REDACTED, is_sensitive_key, to_payload
from otel_verl.exporters._scrub import scrub


def load(value, max_bytes=65536, redact=True):
    payload = to_payload(value, max_bytes=max_bytes, redact=redact)
    assert len(payload.json.encode()) <= max(256, max_bytes)
    return json.loads(payload.json), payload


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Output:
    prompt_ids: list
    reward_score: float
    color: Color


class Msg(pydantic.BaseModel):
    role: str
    content: str


class FakeTensor:  # looks like a torch tensor by module name: not one, so not unpacked
    __module__ = "torch"

    def __init__(self, data):
        self.data = data

    def detach(self):
        return self

    def numel(self):
        return len(self.data)

    def cpu(self):
        return self

    def tolist(self):
        return list(self.data)


FakeTensor.__module__ = "torch"


def test_common_rollout_types():
    data, payload = load({
        "out": Output([1, 2], 0.5, Color.RED),
        "msgs": [Msg(role="user", content="hi")],
        "arr": np.arange(3),
        "scalar": np.float32(1.5),
        "tensor": FakeTensor([4, 5]),
        "raw": b"\x00bytes",
        "tags": {"b", "a"},
        "when": datetime(2026, 1, 2),
        "nan": float("nan"),
        7: "int key",
    })
    assert data["out"] == {"prompt_ids": [1, 2], "reward_score": 0.5, "color": "red"}
    assert data["msgs"] == [{"_type": "Msg", "role": "user", "content": "hi", "_class_name": "Msg",
                             "_bases": ["BaseModel"]}]
    assert data["arr"] == [0, 1, 2] and data["scalar"] == 1.5
    assert data["tensor"] == "<torch.FakeTensor>"  # nothing called on an unknown type
    assert data["raw"]["__bytes__"] == 6
    assert data["tags"] == ["a", "b"]
    assert data["when"] == "2026-01-02T00:00:00"
    assert data["nan"] == "nan" and data["7"] == "int key"
    assert not payload.truncated and payload.error is None


def test_cycles_and_hostile_objects():
    loop = {"a": 1}
    loop["self"] = loop

    class BadRepr:
        def __repr__(self):
            raise RuntimeError("no")

    class BadIter(list):  # a list's own items are read, its __iter__ is not called
        def __iter__(self):
            raise RuntimeError("iter")

    class BadMapping(Mapping):
        def __getitem__(self, key):
            raise KeyError(key)

        def __iter__(self):
            raise RuntimeError("items")

        def __len__(self):
            return 1

    data, payload = load({"loop": loop, "bad": BadRepr(), "iter": BadIter([1]),
                          "map": BadMapping()})
    assert data["loop"]["self"] == "<cycle>"
    assert data["bad"].endswith("BadRepr>")  # recorded by type name, repr never called
    assert data["iter"] == [1]
    assert data["map"].startswith("<unserialisable")
    assert "RuntimeError: items" in payload.error


def test_big_arrays_are_summarised():
    data, _ = load(np.zeros((300, 300)))
    assert data["__array__"] == "numpy" and data["shape"] == [300, 300]


@pytest.mark.parametrize("key", ["api_key", "Authorization", "password", "client_secret",
                                 "WANDB_API_KEY", "access_token", "cookie"])
def test_sensitive_keys_redacted(key):
    data, payload = load({key: "value", "content": "fine"})
    assert data[key] == REDACTED and data["content"] == "fine" and payload.redacted == 1


@pytest.mark.parametrize("key", ["prompt_ids", "max_tokens", "response_ids", "input_tokens"])
def test_token_keys_are_not_secrets(key):
    assert not is_sensitive_key(key)


@pytest.mark.parametrize("secret", [
    "Bearer abcdefghijklmnop1234", "sk-proj-abcdefghijklmnop1234", "0123456789abcdef0123456789abcdef01234567",
    "hf_abcdefghijklmnopqrstuvwxyz123456",
])
def test_secret_looking_values_redacted_at_span_end(secret):
    # capture redacts by key name only; values are found once, by the span-end pass
    payload = to_payload({"content": f"please use {secret} now"}, max_bytes=65536)
    text, count = scrub(payload.json)
    data = json.loads(text)
    assert secret not in data["content"] and REDACTED in data["content"]
    assert count == 1


def test_redaction_can_be_turned_off():
    data, payload = load({"api_key": "x"}, redact=False)
    assert data["api_key"] == "x" and payload.redacted == 0


def test_long_string_cut_with_marker():
    data, payload = load({"text": "x" * 5000}, max_bytes=1000)
    assert payload.truncated and "truncated" in data["text"]


def test_long_list_cut_with_marker():
    data, payload = load([{"role": "user", "content": "y" * 50}] * 500, max_bytes=2000)
    assert payload.truncated
    assert isinstance(data, list) and "more items" in data[-1]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=10),
                                                                      children, max_size=8),
    max_leaves=60,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.integers(min_value=256, max_value=4096))
def test_always_valid_json_within_cap(value, cap):
    load(value, max_bytes=cap)


def test_long_sensitive_key_is_redacted_on_the_fast_path():
    key = "my_" + "x" * 200 + "_password"
    data, payload = load({key: "hunter2"})
    assert data[key] == REDACTED and payload.redacted == 1


@pytest.mark.parametrize("value", [
    list(range(100_000, 130_000)), {"a": [1.5, True, None, 2**70], "b": "x" * 5000},
    [{"api_key": "k", "n": [1, 2]}] * 300, [float("nan"), 1],
])
def test_stdlib_encoder_fallback_gives_the_same_json(monkeypatch, value):
    from otel_verl import _payload

    fast = to_payload(value, max_bytes=4096)
    monkeypatch.setattr(_payload, "_orjson", None)
    slow = to_payload(value, max_bytes=4096)
    assert json.loads(slow.json) == json.loads(fast.json) or slow.truncated
    assert len(slow.json.encode()) <= 4096 and slow.redacted == fast.redacted


class FunctionCall(pydantic.BaseModel):
    name: str
    arguments: str


class ToolResponse(pydantic.BaseModel):
    text: str | None = None


class RichToolResponse(ToolResponse):
    model_config = pydantic.ConfigDict(extra="allow")


def test_pydantic_models_keep_their_class_as_weaves_client_records_it():
    """``_type`` first, the fields, ``_class_name`` and ``_bases`` last: what weave 0.52's
    ``pydantic_object_record`` + ``to_json`` write (the weave tier compares with the client)."""
    data, _ = load(("text", [FunctionCall(name="calc", arguments="{}")],
                    RichToolResponse(text="5", note="extra")))
    assert data == [
        "text",
        [{"_type": "FunctionCall", "name": "calc", "arguments": "{}",
          "_class_name": "FunctionCall", "_bases": ["BaseModel"]}],
        {"_type": "RichToolResponse", "text": "5", "note": "extra",
         "_class_name": "RichToolResponse", "_bases": ["ToolResponse", "BaseModel"]},
    ]
    assert list(data[2]) == ["_type", "text", "note", "_class_name", "_bases"]

