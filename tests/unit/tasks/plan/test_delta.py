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
from embedline.keys import rows_sha256, text_sha256
from tasks.plan import delta, delta_lookup


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
    monkeypatch.setattr(delta_lookup, "_PARTITION_ROWS", partition_rows)
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
        found = delta_lookup.look_up(open_store(str(tmp_path / "out")), plan, base, scratch)
    dropped_before = "id10"  # entry 1 dropped it already: neither live nor written now
    counts = found.counts
    changed = {new_id for new_id, _ in (old[i] for i in edited)} - gone - {"id30", dropped_before}
    assert counts["added"] == 1 + (dropped_before in dict(new))
    assert counts["changed"] == len(changed)
    assert counts["removed"] == len(gone - {dropped_before}) + 1  # the emptied row
    assert counts["empty"] == 1
    written = delta._written_rows(plan, pa.concat_tables(found.written)).column("id").to_pylist()
    assert sorted(written) == sorted(changed | {"fresh"} | ({dropped_before} & set(dict(new))))
    drops = sorted(i for ids in found.drops.values() for i in ids)
    assert drops == sorted(changed | (gone - {dropped_before}) | {"id30"})


@pytest.mark.parametrize("partition_rows", [1_000_000, 17])
def test_an_id_a_previous_delta_rewrote_is_looked_up_in_its_live_object_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partition_rows: int
) -> None:
    """The base holds id3 twice, dropped from its first object and live in a later delta
    object (as a delta night leaves it), and the input moves rows between planned chunks:
    each id is compared once, with its live row, whatever its partition or chunk."""
    monkeypatch.setattr(delta_lookup, "_PARTITION_ROWS", partition_rows)
    monkeypatch.setattr(delta_lookup, "_SPILL_ROWS", 5)  # several sorted groups per side
    old = [(f"id{i}", f"text {i}") for i in range(40)]
    base = _base(tmp_path / "out", [*old, ("id3", "text 3 again"), ("id40", "text 40")], 10)
    first, later = base["chunks"][0], base["chunks"][4]  # type: ignore[index]
    first["drop_ids"], first["rows"] = ["id3"], 9
    base["chunks"][1].pop("drop_ids")  # type: ignore[index]
    base["chunks"][1]["rows"] = 10  # type: ignore[index]
    assert later["rows"] == 2
    base["rows_published"] = 41
    new = [*reversed(old[20:]), ("id40", "text 40"), *old[:20]]  # rows change chunks
    new[new.index(("id3", "text 3"))] = ("id3", "text 3 again")  # the live text: unchanged
    new[new.index(("id7", "text 7"))] = ("id7", "text 7 edited")
    plan = _night(tmp_path, new)
    with Scratch.create(tmp_path) as scratch:
        found = delta_lookup.look_up(open_store(str(tmp_path / "out")), plan, base, scratch)
    assert found.counts["unchanged"] == 40
    assert (found.counts["changed"], found.counts["added"], found.counts["removed"]) == (1, 0, 0)
    assert delta._written_rows(plan, pa.concat_tables(found.written)).column("id").to_pylist() == [
        "id7"
    ]
    assert found.drops == {0: ["id7"]}


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("lines_known", [True, False])
def test_a_delta_chunk_reads_its_scattered_rows_a_span_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, newline: str, lines_known: bool
) -> None:
    """A delta chunk's rows, taken from planned chunks all through the input (records over
    several lines, blank lines between), equal the planned chunks' rows at those positions,
    parsed alone from the lines planning saw them on or up to the last position, however
    many spans it reads; bytes changed since planning are refused."""
    from dataclasses import replace

    from adapters import csv_chunks
    from adapters.row_facts import chunk_rows
    from embedline.errors import InputError
    from embedline.models import ChunkPart

    rows = [(f"id{i}", f'text "{i}", with, commas{newline}and a line') for i in range(70)]
    path = tmp_path / "in.csv"
    body = "".join(
        f'{i},"{t.replace(chr(34), 2 * chr(34))}"{newline}' + (newline if n % 4 == 1 else "")
        for n, (i, t) in enumerate(rows)
    )
    path.write_bytes(f"id,text{newline}{body}".encode())
    plan = plan_csv(
        path, id_column="id", text_column="text", codec="utf-8", chunk_size=7, model="m",
        dimensions=8, scratch_root=str(tmp_path),
    )  # fmt: skip
    taken = {0: (0, 3), 2: (6,), 3: (1, 2, 5), 9: (4, 6)}
    parts = []
    for c in plan.chunks:
        if c.index not in taken:
            continue
        facts = chunk_rows(str(plan.scratch), c.index)
        at = list(taken[c.index])
        parts.append(
            ChunkPart(
                first_row=c.first_row,
                line_start=c.line_start,
                rows=c.rows,
                byte_start=c.byte_start,
                byte_stop=c.byte_stop,
                bytes_sha256=c.bytes_sha256,
                positions=taken[c.index],
                lines=tuple(facts.column("line").take(at).to_pylist()) if lines_known else (),
                last_lines=tuple(facts.column("last_line").take(at).to_pylist())
                if lines_known
                else (),
            )
        )
    spec = replace(
        plan.chunks[0],
        rows=sum(len(p) for p in taken.values()),
        byte_stop=parts[-1].byte_stop,
        parts=tuple(parts),
    )
    whole = {i: csv_chunks.read_chunk(plan.source, plan.chunks[i]) for i in taken}
    expected = [whole[i][p] for i, at in taken.items() for p in at]
    assert [r.id for r in expected] == [
        "id0",
        "id3",
        "id20",
        "id22",
        "id23",
        "id26",
        "id67",
        "id69",
    ]
    for span_bytes in (1 << 30, 200, 1):
        monkeypatch.setattr(csv_chunks, "_SPAN_BYTES", span_bytes)
        assert csv_chunks.read_chunk(plan.source, spec) == expected
    data = path.read_bytes()
    checked = replace(
        spec, rows_sha256=rows_sha256([r.id for r in expected], [r.text_sha256 for r in expected])
    )
    assert csv_chunks.read_chunk(plan.source, checked) == expected
    # a byte of a row it does not take (row 1 of planned chunk 2): the rows are the planned ones
    untaken = data.index(b'text ""15""')
    edited = data[:untaken] + b"X" + data[untaken + 1 :]
    path.write_bytes(edited)
    if lines_known:
        assert csv_chunks.read_chunk(plan.source, checked) == expected
    else:  # no lines to find its records by: the parts' bytes are checked
        with pytest.raises(InputError, match="changed while the run read it"):
            csv_chunks.read_chunk(plan.source, checked)
    # a byte of a row it takes (row 3 of planned chunk 2: "id20"), whatever is checked
    taken_at = data.index(b'text ""20""') + 7
    for checking in (spec, checked):
        path.write_bytes(data[:taken_at] + b"X" + data[taken_at + 1 :])
        with pytest.raises(InputError, match="changed while the run read it"):
            csv_chunks.read_chunk(plan.source, checking)
    at = parts[1].byte_start + 10
    path.write_bytes(data[:at] + b"X" + data[at + 1 :])
    with pytest.raises(InputError, match="changed while the run read it"):
        csv_chunks.read_chunk(plan.source, spec)
