"""``_OpSpec.bind`` for ``(a, b=..., *, c, **kwargs)`` signatures (verl's
``AgentLoop.run(self, sampling_params, **kwargs)``): bound without ``inspect.Signature.bind``,
to exactly what ``Signature.bind`` + ``apply_defaults`` give (the same keys in the same order,
the extra keywords as one dict in call order), and to the same fallback where binding fails."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_verl._decorator import _OpSpec


def run(self, sampling_params, **kwargs): ...  # noqa: ANN001, ANN003, ANN201


def mixed(a, b=2, *, c, d=4, **extra): ...  # noqa: ANN001, ANN003, ANN201


def only(**kw): ...  # noqa: ANN003, ANN201


_FUNCS = [run, mixed, only]


def _reference(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    spec = _OpSpec(fn, None, None, True, True)
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        bound.apply_defaults()
        inputs = dict(bound.arguments)
    except TypeError:
        inputs = {"args": list(args), "kwargs": kwargs}
    owner = inputs.pop(spec.names[0]) if spec.has_self and spec.names[0] in inputs else None
    return owner, list(inputs.items()), [list(v.items()) for v in inputs.values()
                                          if type(v) is dict]


_names = st.sampled_from(["self", "sampling_params", "a", "b", "c", "d", "kwargs", "extra",
                          "kw", "raw_prompt", "x"])


@given(st.sampled_from(_FUNCS), st.lists(st.integers(), max_size=4),
       st.dictionaries(_names, st.integers(), max_size=5))
def test_the_precompiled_binder_binds_as_signature_bind(fn, args, kwargs):
    spec = _OpSpec(fn, None, None, True, True)
    owner, inputs = spec.bind(tuple(args), dict(kwargs))
    got = (owner, list(inputs.items()), [list(v.items()) for v in inputs.values()
                                         if type(v) is dict])
    assert got == _reference(fn, tuple(args), dict(kwargs))


def test_a_plain_var_keyword_signature_is_bound_without_signature_bind(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Signature.bind called")

    spec = _OpSpec(run, None, None, True, True)
    monkeypatch.setattr(inspect.Signature, "bind", refuse)
    owner, inputs = spec.bind(("loop", {"t": 1}), {"raw_prompt": [1], "index": 3})
    assert owner == "loop"
    assert list(inputs.items()) == [("sampling_params", {"t": 1}),
                                    ("kwargs", {"raw_prompt": [1], "index": 3})]


@pytest.mark.parametrize("call", [((), {}), (("s", 1, 2), {}), (("s",), {"self": 1})])
def test_what_cannot_be_bound_falls_back_as_before(call):
    args, kwargs = call
    spec = _OpSpec(run, None, None, True, True)
    owner, inputs = spec.bind(args, kwargs)
    assert (owner, list(inputs.items())) == _reference(run, args, kwargs)[:2]
