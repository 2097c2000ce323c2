"""The viewer's export of its filtered table (issue 22): ``/export.jsonl`` and ``/export.parquet``
with the table's filters, served over HTTP by the viewer's own server over real rollouts."""

from __future__ import annotations

import http.client
import io
import json
import threading

import pyarrow.parquet as pq

from otel_verl.ui._lake import LakeSource
from otel_verl.ui.server import UIServer

from .test_parity import _run


def _get(port: int, path: str) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read(), response.getheader("Content-Type") or ""
    finally:
        conn.close()


def test_the_viewer_exports_its_filtered_table(tmp_path):
    outs, _ = _run(tmp_path, 3)
    index = LakeSource(tmp_path / "traces", compact=False)
    server = UIServer(index, port=0, poll_s=60.0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        status, body, kind = _get(port, "/export.jsonl?sample_index=2&validate=false")
        assert status == 200 and kind == "application/x-ndjson"
        (row,) = [json.loads(line) for line in body.decode().splitlines()]
        assert row["sample_index"] == 2
        assert row["response_ids"] == outs[2].response_ids
        assert row["response_mask"] == outs[2].response_mask
        status, body, _ = _get(port, "/export.parquet")
        assert status == 200 and pq.read_table(io.BytesIO(body)).num_rows == 3
        status, _, _ = _get(port, "/export.jsonl?step=two")
        assert status == 400
    finally:
        server.shutdown()
        index.close()
        server.server_close()
