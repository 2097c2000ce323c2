"""Trajectory rewards as Arize Phoenix span annotations.

Phoenix reads our spans over OTLP as they are (kinds, inputs/outputs, token counts, sessions), but
it shows a score as an *evaluation* only when it arrives as an annotation through its REST API; a
span event such as ``gen_ai.evaluation.result`` stays an event. This module reads the trajectory
spans of a project back from Phoenix and posts one annotation per reward and per reward
component (each its own ``gen_ai.evaluation.result``: name = ``gen_ai.evaluation.name``, score,
label, explanation; annotator ``CODE``). Annotations carry the identifier
``otel_verl``, so running it again updates them instead of adding copies.

Usage::

    python -m otel_verl.integrations.phoenix annotate-rewards \\
        --url http://127.0.0.1:6006 --project my_project [--api-key "$PHOENIX_API_KEY"]

    from otel_verl.integrations.phoenix import annotate_rewards
    annotate_rewards("http://127.0.0.1:6006", "my_project")   # -> number of annotations posted

Only the standard library is used (no Phoenix client needed). Run it after the rollout's spans were
delivered (``RolloutTraceConfig.flush()``/``shutdown()``); spans Phoenix has not stored yet are
simply not annotated this time.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from otel_verl import semconv

__all__ = ["annotate_rewards", "main", "reward_annotations", "trajectory_spans"]

#: upsert key of our annotations (Phoenix: unique by name, span and identifier)
IDENTIFIER = "otel_verl"
_PAGE = 1000
_BATCH = 100


def _request(url: str, *, body: Any = None, api_key: str | None = None,
             timeout_s: float = 30.0) -> Any:
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=data, headers=headers,
                                     method="POST" if data is not None else "GET")
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - http(s) URL
        return json.load(answer)


def trajectory_spans(url: str, project: str, *, api_key: str | None = None,
                     timeout_s: float = 30.0) -> Iterator[dict[str, Any]]:
    """The project's trajectory spans (``otel_verl.trajectory=true``) as Phoenix returns them."""
    base = url.rstrip("/")
    cursor: str | None = None
    while True:
        query = [("attribute", f"{semconv.OTEL_VERL_TRAJECTORY}:true"), ("limit", str(_PAGE))]
        if cursor:
            query.append(("cursor", cursor))
        page = _request(f"{base}/v1/projects/{urllib.parse.quote(project, safe='')}/spans?"
                        f"{urllib.parse.urlencode(query)}", api_key=api_key, timeout_s=timeout_s)
        yield from page.get("data") or ()
        cursor = page.get("next_cursor")
        if not cursor:
            return


def reward_annotations(span: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The annotations for one trajectory span: one per ``gen_ai.evaluation.result`` event, or
    one named ``reward`` from ``rollout.reward`` when the span has no such event."""
    span_id = span["context"]["span_id"]
    attributes = span.get("attributes") or {}
    metadata = {key.split(".", 1)[1]: attributes[key] for key in semconv.TRAJECTORY_KEYS
                if key in attributes}
    out: list[dict[str, Any]] = []
    for event in span.get("events") or ():
        if event.get("name") != semconv.GEN_AI_EVALUATION_RESULT:
            continue
        attrs = event.get("attributes") or {}
        score = attrs.get(semconv.GEN_AI_EVALUATION_SCORE_VALUE)
        label = attrs.get(semconv.GEN_AI_EVALUATION_SCORE_LABEL)
        if score is None and label is None:
            continue
        out.append(_annotation(span_id, str(attrs.get(semconv.GEN_AI_EVALUATION_NAME, "reward")),
                               score, label, metadata,
                               attrs.get(semconv.GEN_AI_EVALUATION_EXPLANATION)))
    if not out and attributes.get(semconv.ROLLOUT_REWARD) is not None:
        out.append(_annotation(span_id, "reward", attributes[semconv.ROLLOUT_REWARD], None,
                               metadata))
    return out


def _annotation(span_id: str, name: str, score: Any, label: Any,
                metadata: Mapping[str, Any], explanation: Any = None) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if score is not None:
        result["score"] = float(score)
    if label is not None:
        result["label"] = str(label)
    if explanation is not None:
        result["explanation"] = str(explanation)
    return {"span_id": span_id, "name": name, "annotator_kind": "CODE", "result": result,
            "identifier": IDENTIFIER, "metadata": dict(metadata)}


def annotate_rewards(url: str, project: str, *, api_key: str | None = None,
                     timeout_s: float = 30.0) -> int:
    """Post every trajectory reward of ``project`` as a span annotation; returns how many.

    Raises:
        urllib.error.URLError / HTTPError: Phoenix is unreachable or refused the request.
    """
    base = url.rstrip("/")
    annotations = [a for span in trajectory_spans(base, project, api_key=api_key,
                                                  timeout_s=timeout_s)
                   for a in reward_annotations(span)]
    for start in range(0, len(annotations), _BATCH):
        _request(f"{base}/v1/span_annotations?sync=true",
                 body={"data": annotations[start:start + _BATCH]}, api_key=api_key,
                 timeout_s=timeout_s)
    return len(annotations)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_verl.integrations.phoenix",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    annotate = sub.add_parser("annotate-rewards",
                              help="post trajectory rewards as Phoenix span annotations")
    annotate.add_argument("--url", default="http://127.0.0.1:6006", help="Phoenix's address")
    annotate.add_argument("--project", required=True, help="the rollout's project_name")
    annotate.add_argument("--api-key", default=None, help="Phoenix API key (auth enabled)")
    annotate.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    count = annotate_rewards(args.url, args.project, api_key=args.api_key,
                             timeout_s=args.timeout_s)
    print(f"{count} reward annotation(s) posted to {args.url} project {args.project!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
