"""Compaction reads and parses each file's next stretch ahead, in a thread, while the rows of the
one before are built: with stretches of a few KiB (many of them, each read ahead), the segments
hold exactly the rows, and the manifest exactly the counts, of a compaction of whole files."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import _lake_store as L
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_verl.store import _compact
from otel_verl.store._compact import Manifest, compact, lake_dir

ROOT = Path(__file__).resolve().parents[2]


def _lake(store: Path) -> tuple[list[Any], dict[str, Any]]:
    """Every span row of the committed segments (sorted), and the manifest's sources."""
    lake = lake_dir(store)
    manifest = Manifest.load(lake)
    tables = [pq.read_table(Path(lake, s)) for s in manifest.segments]
    rows = pa.concat_tables(tables).drop_columns(["Timestamp", "Events.Timestamp"]).to_pylist()
    return sorted(rows, key=lambda r: (r["TraceId"], r["SpanId"], r["source_offset"])), \
        {k: {f: v for f, v in e.items() if f != "head"} for k, e in manifest.sources.items()}


def test_stretches_read_ahead_give_the_same_lake(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    L.write_store(store, 7, steps=4, prompts=4, n=4, files=2)
    # a file with damaged lines, one longer than a stretch (read from its start to its end)
    with (store / "otel_verl-extra.jsonl").open("ab") as handle:
        handle.write(b"{not json\n" + b'{"x": "' + b"y" * 10_000 + b'"}\n{not json\n')
    compact(store, live_bytes=0)
    whole = _lake(store)
    shutil.rmtree(lake_dir(store))

    taken = [0]
    real_take = _compact._Prefetch.take

    def take(self: Any, *args: Any) -> Any:
        got = real_take(self, *args)
        taken[0] += got is not None
        return got

    monkeypatch.setattr(_compact._Prefetch, "take", take)
    monkeypatch.setattr(_compact, "STRETCH", 4096)
    stats = compact(store, live_bytes=0)
    assert taken[0] >= 10  # most stretches came from the thread
    assert stats.spans == len(whole[0])
    assert _lake(store) == whole
