"""The delta lookup (``tasks/plan/delta.py``): each input row classified once against the
base run's rows, whether the ids are joined at once or a partition at a time."""

from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adapters.csv_source import plan_csv
from adapters.object_store import open_store
from adapters.scratch import Scratch
from embedline.keys import text_sha256
from tasks.plan import delta


def _base(out: Path, rows: list[tuple[str, str]], per_object: int) -> dict[str, object]:
    """A committed run's manifest over objects of ``per_object`` rows (key columns only: the
    lookup reads nothing else); the object at entry 1 already drops its first id."""
    store = open_store(str(out))
    store.prepare()
    entries = []
    for n, start in enumerate(range(0, len(rows), per_object)):
        part = rows[start : start + per_object]
        buf = io.BytesIO()
        pq.write_table(
            pa.table(
                {"id": [i for i, _ in part], "text_sha256": [text_sha256(t) for _, t in part]}
            ),
            buf,
        )
        body = buf.getvalue()
        key = f"chunks/base{n}.parquet"
        digest = hashlib.sha256(body).hexdigest()
        store.put_if_absent(key, body, sha256=digest, content_type="application/octet-stream")
        entry: dict[str, object] = {
            "index": n,
            "key": f"base{n}",
            "object": key,
            "rows": len(part),
            "sha256": digest,
        }
        if n == 1:
            entry["drop_ids"], entry["rows"] = [part[0][0]], len(part) - 1
        entries.append(entry)
    live = sum(int(e["rows"]) for e in entries)  # type: ignore[call-overload]
    return {"run_key": "b" * 64, "chunks": entries, "rows_published": live, "dimensions": 8}


def _night(tmp: Path, rows: list[tuple[str, str]]) -> object:
    path = tmp / "in.csv"
    path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in rows), encoding="utf-8")
    return plan_csv(
        path, id_column="id", text_column="text", codec="utf-8", chunk_size=7, model="m",
        dimensions=8, scratch_root=str(tmp),
    )  # fmt: skip


@pytest.mark.parametrize("partition_rows", [1_000_000, 17])
def test_each_row_is_classified_once_joined_whole_or_by_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partition_rows: int
) -> None:
    monkeypatch.setattr(delta, "_PARTITION_ROWS", partition_rows)
    old = [(f"id{i}", f"text {i}") for i in range(60)]
    base = _base(tmp_path / "out", old, per_object=10)
    rng = random.Random(4)
    new = list(old)
    edited = rng.sample(range(60), 6)
    for i in edited:
        new[i] = (new[i][0], new[i][1] + " edited")
    new[30] = (new[30][0], "   ")  # emptied
    gone = {new[5][0], new[44][0]}
    new = [r for r in new if r[0] not in gone] + [("fresh", "a new text")]
    plan = _night(tmp_path, new)
    with Scratch.create(tmp_path) as scratch:
        found = delta._look_up(open_store(str(tmp_path / "out")), plan, base, scratch)
    dropped_before = "id10"  # entry 1 dropped it already: neither live nor written now
    counts = found.counts
    changed = {new_id for new_id, _ in (old[i] for i in edited)} - gone - {"id30", dropped_before}
    assert counts["added"] == 1 + (dropped_before in dict(new))
    assert counts["changed"] == len(changed)
    assert counts["removed"] == len(gone - {dropped_before}) + 1  # the emptied row
    assert counts["empty"] == 1
    written = pa.concat_tables(found.written).column("id").to_pylist()
    assert sorted(written) == sorted(changed | {"fresh"} | ({dropped_before} & set(dict(new))))
    drops = sorted(i for ids in found.drops.values() for i in ids)
    assert drops == sorted(changed | (gone - {dropped_before}) | {"id30"})
