"""Scratch space (``adapters/scratch.py``): spills read back exactly, directories of dead
processes swept, live ones never; and the planning pass's per-row facts
(``adapters/row_facts.py``) find duplicated ids bucket by bucket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from adapters.csv_source import plan_csv
from adapters.row_facts import ROW_DTYPE, RowFacts
from adapters.scratch import Scratch, Spill, hash_prefixes, release, stable_order
from embedline.errors import InputError
from embedline.keys import text_sha256

REPO = Path(__file__).resolve().parents[3]


def test_a_spill_gives_back_each_partition_in_the_order_added(tmp_path: Path) -> None:
    spill = Spill(tmp_path / "s", np.dtype("<u8"), buffer_rows=7)  # flushes mid-way
    rng = np.random.default_rng(1)
    values = rng.integers(0, 2**63, 100).astype(np.uint64)
    parts = values % np.uint64(5)
    for start in range(0, 100, 9):
        spill.add(values[start : start + 9], parts[start : start + 9].astype(np.int64))
    assert spill.partitions() == [0, 1, 2, 3, 4] and spill.rows == 100
    for part in range(5):
        np.testing.assert_array_equal(spill.read(part), values[parts == part])
    reopened = Spill(tmp_path / "s", np.dtype("<u8"))  # by path, as the reuse stage does
    np.testing.assert_array_equal(reopened.read(3), values[parts == 3])
    spill.drop(3)
    assert 3 not in spill.partitions() and len(spill.read(3)) == 0


def test_records_filled_in_place_are_read_back_in_the_order_committed(tmp_path: Path) -> None:
    """``reserve`` gives at most the buffer's free room; ``commit`` adds only what was
    filled; runs in partition order (the flush's fast path) and shuffled ones both come
    back per partition in the order committed."""
    dtype = np.dtype([("position", "<u4"), ("value", "<f4", (3,))])
    spill = Spill(tmp_path / "s", dtype, buffer_rows=7)
    rng = np.random.default_rng(2)
    expected: dict[int, list[tuple[int, float]]] = {}
    position = 0
    for step in range(40):
        want = int(rng.integers(1, 12))
        room = spill.reserve(want)
        assert 1 <= len(room) <= min(want, 7)
        filled = int(rng.integers(1, len(room) + 1))
        parts = np.sort(rng.integers(0, 4, filled)) if step % 2 else rng.integers(0, 4, filled)
        room["position"][:filled] = np.arange(position, position + filled)
        room["value"][:filled] = np.arange(position, position + filled)[:, None] * 0.5
        spill.commit(filled, parts.astype(np.int64))
        for offset, part in enumerate(parts.tolist()):
            expected.setdefault(part, []).append((position + offset, (position + offset) * 0.5))
        position += filled
    assert spill.rows == position
    for part, rows in expected.items():
        got = spill.read(part)
        assert [
            (int(p), float(v[0])) for p, v in zip(got["position"], got["value"], strict=True)
        ] == rows
        assert (got["value"][:, 2] == got["value"][:, 0]).all()


def test_records_added_are_copied_so_the_caller_may_reuse_its_array(tmp_path: Path) -> None:
    """``add`` copies into the spill's one buffer: a caller refilling the same array (as
    the gather's route does, source after source) neither corrupts what it added nor makes
    the spill hold every array until a flush."""
    spill = Spill(tmp_path / "s", np.dtype("<u8"), buffer_rows=100)
    values = np.zeros(10, dtype=np.uint64)
    for step in range(25):
        values[:] = step
        spill.add(values, step % 3)
    for part in range(3):
        np.testing.assert_array_equal(
            spill.read(part), np.repeat(np.arange(part, 25, 3), 10).astype(np.uint64)
        )


@pytest.mark.parametrize("top", [3, 255, 65535, 65536, 2**40])
def test_stable_order_is_numpys_stable_argsort(top: int) -> None:
    keys = np.random.default_rng(top).integers(0, top + 1, 10_000).astype(np.int64)
    np.testing.assert_array_equal(stable_order(keys), np.argsort(keys, kind="stable"))
    assert len(stable_order(np.zeros(0, dtype=np.int64))) == 0


def test_the_sweep_leaves_everything_it_did_not_make(tmp_path: Path) -> None:
    """``--ledger ledger.sqlite3`` puts scratch directories in ``./scratch/``, which may be a
    folder of the user's: only a dead run's own directories are deleted (a break test lost a
    backdated ``scratch/.venv`` and a folder holding a ``.lock`` file)."""
    base = tmp_path / "scratch"
    hour_ago = time.time() - 2 * 3600
    keep = {
        ".venv/bin/activate": "x",  # a dot-folder over an hour old
        "exp1/.lock": "",  # a folder with a lock file nobody holds
        "exp1/results.csv": "x",
        "0123456789abcdef/data.bin": "x",  # a token's name, but no lock: not ours
        ".0123456789abcdef/.lock": "",  # being made, but holds more than its lock
        ".0123456789abcdef/mine.txt": "x",
        "notes.txt": "x",
    }
    for name, text in keep.items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(text)
    dead_making = base / ".fedcba9876543210"  # a maker that died before the rename
    dead_making.mkdir()
    (dead_making / ".lock").write_text("")
    for path in (base / ".venv", base / ".0123456789abcdef", dead_making):
        os.utime(path, (hour_ago, hour_ago))
    (base / "link").symlink_to(tmp_path)
    with Scratch.create(tmp_path) as scratch:
        for name in keep:
            assert (base / name).exists(), name
        assert (base / "link").is_symlink() and tmp_path.exists()
        assert not dead_making.exists()
        assert scratch.path.parent == base


def test_hash_prefixes_are_the_first_16_hex_digits() -> None:
    hashes = [text_sha256(t) for t in ("a", "b", "ü")]
    assert hash_prefixes(hashes).tolist() == [int(h[:16], 16) for h in hashes]
    assert hash_prefixes([]).dtype == np.uint64


def test_a_dead_process_scratch_is_swept_a_live_one_never(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from adapters.scratch import Scratch; "
            f"s = Scratch.create({str(tmp_path)!r}); print(s.path, flush=True); time.sleep(60)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    theirs = Path(child.stdout.readline().strip())
    mine = Scratch.create(tmp_path)  # their process is alive: kept
    assert theirs.exists() and mine.path.exists()
    os.kill(child.pid, signal.SIGKILL)  # no cleanup runs
    child.wait()
    other = Scratch.create(tmp_path)  # sweeps what a dead process left
    assert not theirs.exists() and mine.path.exists() and other.path.exists()
    release(str(mine.path))
    assert not mine.path.exists()
    other.close()
    other.close()  # idempotent


def test_planning_spills_row_hashes_and_finds_duplicates_over_buckets(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    rows = [(f"id{i}", f"text {i % 7}" if i % 5 else "  ") for i in range(300)]
    path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in rows), encoding="utf-8")
    args = dict(
        id_column="id",
        text_column="text",
        codec="auto",
        chunk_size=40,
        model="m",
        dimensions=None,
        scratch_root=str(tmp_path),
    )
    plan = plan_csv(path, **args)
    assert plan.scratch is not None
    spill = Spill(Path(plan.scratch) / "rows", ROW_DTYPE)
    got = np.concatenate([spill.read(p) for p in spill.partitions()])
    want = {
        (int(text_sha256(t)[:16], 16), i // 40, i % 40)
        for i, (_, t) in enumerate(rows)
        if t.strip()
    }  # empty texts left out
    assert {(int(r["prefix"]), int(r["chunk"]), int(r["position"])) for r in got} == want
    release(plan.scratch)
    assert not Path(plan.scratch).exists()
    path.write_text(
        "id,text\n" + "".join(f"{n % 250},{t}\n" for n, (_, t) in enumerate(rows)), encoding="utf-8"
    )
    with pytest.raises(InputError, match="50 duplicated id"):
        plan_csv(path, **args)
    assert not (tmp_path / "scratch").exists()  # an input error leaves no scratch at all


def test_row_facts_without_scratch_keep_id_digests_in_memory() -> None:
    from array import array

    from adapters.row_facts import id_digests

    facts = RowFacts(None)
    facts.add_chunk(0, ["a", "b", "a"], ["", "", ""], array("i", [0, 0, 0]), [])
    facts.add_chunk(1, ["c", "b"], ["", ""], array("i", [0, 0]), [])
    assert facts.suspects() == {int(d) for d in id_digests(["a", "b"])}
    assert facts.rows is None and facts.count == 5


def test_the_last_scratch_closed_removes_the_empty_scratch_directory(tmp_path: Path) -> None:
    """``scratch/`` sits beside a ledger the user placed anywhere (``--ledger ~/x.sqlite3``):
    it goes with its last directory, and stays while another is open or holds anything."""
    first, second = Scratch.create(tmp_path), Scratch.create(tmp_path)
    base = tmp_path / "scratch"
    first.close()
    assert base.is_dir() and second.path.is_dir()  # another is open
    (base / "notes.txt").write_text("the user's")
    second.close()
    assert base.is_dir() and (base / "notes.txt").exists()  # not empty: kept
    (base / "notes.txt").unlink()
    third = Scratch.create(tmp_path)
    third.close()
    assert not base.exists()


def test_a_scratch_directory_removed_while_another_is_made_is_made_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process may remove ``scratch/`` empty between this one's mkdir and its
    own directory's: ``create`` makes it again instead of failing the run."""
    import adapters.scratch as scratch

    sweep = scratch.sweep_dead
    removed = []

    def sweep_then_lose_the_base(base: Path) -> list[Path]:
        found = sweep(base)
        if not removed:  # the other process's close, just after this one's mkdir
            base.rmdir()
            removed.append(base)
        return found

    monkeypatch.setattr(scratch, "sweep_dead", sweep_then_lose_the_base)
    made = Scratch.create(tmp_path)
    assert removed and made.path.is_dir() and (made.path / ".lock").exists()
    made.close()
