"""The whole pipeline under a seeded property test: random sequences of nights over one
output, each checked against invariants that hold whatever the sequence.

A night is a real CLI run (``python -m cli run``) against the fake OpenAI server, on the
session's Prefect server. A seed (``random.Random(seed)``) draws the sequence: ids random
and odd (spaces inside and around, quotes, commas, non-ASCII), texts shared by several ids,
text edits, deletes, kept-column edits (``--keep-columns section``); each night on ledger A,
on ledger B or on a fresh one; delta nights and an occasional ``--compact``; a LanceDB sink
on some nights; an occasional ``kill -9`` at a random moment followed by the rerun (on the
same ledger, or on a fresh one: a lost ledger); an occasional overlapping night (a second
CLI started while the first embeds, which waits for it: ``--wait-for-live-run``).

Invariants after every night, judged by the fake server and its deterministic vectors, never
by embedline's own counts:

- the output read back as a plain reader does (each manifest entry's object without the ids
  it drops) equals the night's input exactly: ids, vectors (``expected_vector`` of each
  row's text), kept column;
- on a night with ``--sink``, the sink holds exactly the same rows;
- each distinct text is charged at most once over all nights (one model, one dimension), a
  lost ledger included: the store is the truth. The only exception is a text whose request
  was in flight when a night was killed (answered by the server, never received or stored).

CI runs ``CI_SEEDS`` × ``CI_NIGHTS`` nights; ``-m slow`` runs the soak:
``EMBEDLINE_PROPERTY_SEEDS`` (a count, or comma-separated seeds to replay one) ×
``EMBEDLINE_PROPERTY_NIGHTS`` nights. A failure names the seed and every night's steps.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support.fake_openai import FakeEmbeddingServer, expected_matrix
from tests.support.fixtures import REPO
from tests.support.forked_cli import popen_cli
from tests.support.output import vectors_by_id

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api_url")]

# between them: kills at start-up and mid-embedding, a lost ledger, overlaps, --compact, sinks
CI_SEEDS = (35, 50)
CI_NIGHTS = 4
MAX_ROWS = 60
DELAY_S = 0.25  # per request on nights that are killed or overlapped: time to be caught
IN_FLIGHT_MARGIN_S = 1.5  # answered this long before a kill may not be stored yet
GATE_S = 40.0  # longest hold of the first run's requests while the second one starts

Row = tuple[str, str, str]  # id, text, section (the kept column)

_WORDS = (
    "alpha", "bravo", "naïve", "café", "東京", "データ", "🙂", "O'Brien", 'say "hi"', "a, b",
    "line\nbreak", "Ωmega", "straße", "tab\there", "x",
)  # fmt: skip
_ID_FORMS = (
    "r{n}", "id {n}", " lead{n}", "trail{n} ", "ünï-{n}", "日本{n}", 'q"{n}', "c,{n}", "ß {n} ß",
)  # fmt: skip
_SECTIONS = ("a", "b", "c", "é", "sec tion", "")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- the generator ---------------------------------------------------------------------------


@dataclass
class Night:
    """One step of a sequence: the rows it exports and how it runs."""

    rows: list[Row]
    ledger: str  # "A", "B" or "fresh"
    sink: bool
    compact: bool
    kill: str | None = None  # None, "start" (at a random time) or "embedding"
    rerun_ledger: str | None = None  # the rerun after the kill: same, or "fresh" (lost)
    overlap: Night | None = None  # a second night started while this one embeds
    edits: str = ""

    def describe(self) -> str:
        parts = [f"rows={len(self.rows)} ({self.edits})", f"ledger={self.ledger}"]
        parts += ["sink"] * self.sink + ["--compact"] * self.compact
        if self.kill:
            parts.append(f"kill -9 while {self.kill}, rerun on ledger {self.rerun_ledger}")
        return " ".join(parts)


class Generator:
    """Draws rows and nights from one ``random.Random(seed)``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.next_id = 0
        self.next_text = 0

    def new_id(self) -> str:
        self.next_id += 1
        return self.rng.choice(_ID_FORMS).format(n=self.next_id)

    def new_text(self, rows: list[Row]) -> str:
        if rows and self.rng.random() < 0.3:  # a text another id already has
            return self.rng.choice(rows)[1]
        self.next_text += 1
        words = self.rng.sample(_WORDS, self.rng.randint(1, 3))
        return f"{' '.join(words)} {self.next_text}"

    def section(self) -> str:
        return self.rng.choice(_SECTIONS)

    def first_rows(self) -> list[Row]:
        rows: list[Row] = []
        for _ in range(self.rng.randint(20, MAX_ROWS - 10)):
            rows.append((self.new_id(), self.new_text(rows), self.section()))
        return rows

    def edit(self, rows: list[Row]) -> tuple[list[Row], str]:
        """The next night's export: deletes, text edits, kept-column edits, adds."""
        rng, rows = self.rng, list(rows)
        gone = rng.sample(range(len(rows)), rng.randint(0, min(6, len(rows) - 1)))
        rows = [r for i, r in enumerate(rows) if i not in set(gone)]
        edited = rng.sample(range(len(rows)), rng.randint(0, min(6, len(rows))))
        for i in edited:
            rows[i] = (rows[i][0], self.new_text(rows), rows[i][2])
        kept = rng.sample(range(len(rows)), rng.randint(0, min(6, len(rows))))
        for i in kept:
            rows[i] = (rows[i][0], rows[i][1], self.section())
        added = rng.randint(0, max(0, min(10, MAX_ROWS - len(rows))))
        for _ in range(added):
            row = (self.new_id(), self.new_text(rows), self.section())
            rows.insert(rng.randint(0, len(rows)), row)
        if rng.random() < 0.2:
            rng.shuffle(rows)
        return rows, f"-{len(gone)} ~text {len(edited)} ~kept {len(kept)} +{added}"

    def night(self, rows: list[Row], edits: str) -> Night:
        rng = self.rng
        night = Night(
            rows=rows,
            ledger=rng.choice(("A", "A", "B", "fresh")),
            sink=rng.random() < 0.4,
            compact=rng.random() < 0.2,
            edits=edits,
        )
        if rng.random() < 0.25:
            night.kill = rng.choice(("start", "embedding", "embedding"))
            night.rerun_ledger = rng.choice((night.ledger, night.ledger, "fresh"))
        return night

    def sequence(self, nights: int) -> list[Night]:
        rows = self.first_rows()
        out = [self.night(rows, f"+{len(rows)}")]
        while len(out) < nights:
            rows, edits = self.edit(rows)
            night = self.night(rows, edits)
            if len(out) + 2 <= nights and not night.kill and self.rng.random() < 0.25:
                rows, edits = self.edit(rows)
                night.overlap = self.night(rows, edits)
                night.overlap.kill = night.overlap.rerun_ledger = None
            out.append(night)
            out += [night.overlap] if night.overlap else []
        return out


# -- running and checking --------------------------------------------------------------------


@dataclass
class World:
    """One output, two named ledgers, one LanceDB sink and the fake server of a sequence."""

    tmp: Path
    server: FakeEmbeddingServer
    seed: int
    steps: list[str] = field(default_factory=list)
    delay_s: float = 0.0
    requests: list[tuple[float, list[str]]] = field(default_factory=list)  # (arrival, shas)
    may_repeat: set[str] = field(default_factory=set)  # in flight at a kill
    fresh: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.gate.set()
        self.server.fail_when(self._on_request)

    def _on_request(self, payload: Any) -> dict[str, Any] | None:
        texts = payload.get("input") if isinstance(payload, dict) else None
        texts = texts if isinstance(texts, list) else [texts]
        with self.lock:
            self.requests.append((time.monotonic(), [_sha(t) for t in texts if isinstance(t, str)]))
        self.gate.wait(GATE_S)  # closed while a second run is being started beside this one
        return {"delay_s": self.delay_s} if self.delay_s else None

    def where(self) -> str:
        return f"seed {self.seed}; steps so far:\n  " + "\n  ".join(self.steps)

    def ledger(self, name: str) -> str:
        if name == "fresh":
            self.fresh += 1
            return str(self.tmp / f"fresh-{self.fresh}.sqlite3")
        return str(self.tmp / f"ledger-{name}.sqlite3")

    def args(self, night: Night, ledger: str, csv_name: str) -> list[str]:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(("id", "text", "section"))
        writer.writerows(night.rows)
        (self.tmp / csv_name).write_text(buf.getvalue(), encoding="utf-8")
        args = [
            "run", csv_name, "--embedder", "openai", "--base-url", self.server.base_url,
            "--output", str(self.tmp / "out"), "--ledger", ledger, "--chunk-size", "8",
            "--batch-size", "4", "--concurrency", "2", "--keep-columns", "section",
        ]  # fmt: skip
        args += ["--sink", f"lancedb://{self.tmp / 'db'}?table=t"] * night.sink
        return args + ["--compact"] * night.compact

    def start(self, args: list[str], stderr: Path | None = None) -> subprocess.Popen[str]:
        """Start ``embedline ARGS``; its stderr to a pipe, or to the file ``stderr``."""
        err_file = open(stderr, "w") if stderr else None  # noqa: SIM115 (the child holds it)
        try:
            return popen_cli(
                [sys.executable, "-m", "cli", *args],
                cwd=self.tmp,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.PIPE,
                stderr=err_file or subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        finally:
            if err_file is not None:
                err_file.close()

    def finish(self, proc: subprocess.Popen[str], what: str, stderr: Path | None = None) -> str:
        """Wait for ``proc``; assert exit 0; return its stdout."""
        try:
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        err = stderr.read_text() if stderr else err
        assert proc.returncode == 0, (
            f"{what} exited {proc.returncode}\n{err[-3000:]}\n{self.where()}"
        )
        return out

    def kill(self, night: Night, rng: random.Random, csv_name: str) -> None:
        """Start the night, kill -9 it at a random moment; note what was in flight."""
        before = len(self.requests)
        proc = self.start(self.args(night, self.ledger(night.ledger), csv_name))
        started = time.monotonic()
        if night.kill == "embedding":  # a random moment after its first request
            while len(self.requests) == before and proc.poll() is None:
                assert time.monotonic() - started < 120, f"no request in 120 s\n{self.where()}"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.5))
        else:  # start-up, planning, reuse, the delta: any moment
            time.sleep(rng.uniform(0.3, 5.0))
        ended = proc.poll() is not None
        if not ended:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        killed_at = time.monotonic()
        with self.lock:
            in_flight = {
                sha
                for arrived, shas in self.requests[before:]
                if arrived >= killed_at - self.delay_s - IN_FLIGHT_MARGIN_S
                for sha in shas
            }
        self.may_repeat |= in_flight
        self.steps[-1] += f" [killed after {killed_at - started:.1f} s, " + (
            "it had ended]" if ended else f"{len(in_flight)} texts in flight]"
        )

    def run_night(self, night: Night, rng: random.Random) -> None:
        self.steps.append(f"night {len(self.steps) + 1}: {night.describe()}")
        began = time.monotonic()
        self._run_night(night, rng)
        self.steps[-1] += f" ({time.monotonic() - began:.1f} s)"

    def _run_night(self, night: Night, rng: random.Random) -> None:
        if night.overlap is not None:
            return self.run_overlap(night, night.overlap)
        self.delay_s = DELAY_S if night.kill else 0.0
        if night.kill:
            self.kill(night, rng, "in.csv")
            self.delay_s = 0.0
        ledger = self.ledger(night.rerun_ledger or night.ledger)
        out = self.finish(self.start(self.args(night, ledger, "in.csv")), "run")
        self.check(night, out)

    def run_overlap(self, first: Night, second: Night) -> None:
        """``first`` embeds (slowly); ``second`` starts meanwhile, waits, then runs."""
        self.steps.append(f"night {len(self.steps) + 1}: {second.describe()}, started while")
        self.steps[-1] += " the night before embeds"
        self.delay_s = DELAY_S
        before = len(self.requests)
        self.gate.clear()  # the first run's requests wait until the second one waits for it
        try:
            one = self.start(self.args(first, self.ledger(first.ledger), "in-1.csv"))
            started = time.monotonic()
            while len(self.requests) == before and one.poll() is None:
                assert time.monotonic() - started < 120, f"no request in 120 s\n{self.where()}"
                time.sleep(0.05)
            log = self.tmp / "second.stderr"
            two = self.start(self.args(second, self.ledger(second.ledger), "in-2.csv"), log)
            started = time.monotonic()
            while "waiting for run" not in log.read_text() and time.monotonic() - started < GATE_S:
                if two.poll() is not None or one.poll() is not None:
                    break
                time.sleep(0.1)
        finally:
            self.gate.set()
        out_one = self.finish(one, "the first of two overlapping runs")
        self.delay_s = 0.0
        out_two = self.finish(two, "the second of two overlapping runs", log)
        waited = "waiting for run" in log.read_text()
        self.steps[-1] += " [it waited]" if waited else " [it did not wait]"
        self.check(first, out_one, sink=first.sink and not second.sink)
        self.check(second, out_two)

    def check(self, night: Night, stdout: str, *, sink: bool | None = None) -> None:
        """The night's manifest, its sink and every charge so far, against the truth."""
        where = self.where()
        uri = next(
            ln.split(maxsplit=1)[1] for ln in stdout.splitlines() if ln.startswith("manifest")
        )
        manifest = json.loads(Path(uri.strip()).read_text())
        out = self.tmp / "out"
        bodies = {e["object"]: (out / e["object"]).read_bytes() for e in manifest["chunks"]}
        vectors = vectors_by_id(bodies, manifest)
        sections: dict[str, str] = {}
        for entry in manifest["chunks"]:
            drops = set(entry.get("drop_ids") or ())
            table = pq.read_table(io.BytesIO(bodies[entry["object"]]), columns=["id", "section"])
            for row in table.to_pylist():
                if row["id"] not in drops:
                    sections[row["id"]] = row["section"]
        ids = [r[0] for r in night.rows]
        assert sorted(vectors) == sorted(ids), f"output ids differ from the input\n{where}"
        truth = expected_matrix([r[1] for r in night.rows])
        got = np.stack([vectors[i] for i in ids])
        bad = [ids[n] for n in np.flatnonzero(~np.isclose(got, truth, rtol=1e-6, atol=1e-7).all(1))]
        assert not bad, f"vectors not those of their texts: {bad[:5]}\n{where}"
        assert sections == {r[0]: r[2] for r in night.rows}, f"kept column differs\n{where}"
        if night.sink if sink is None else sink:
            self.check_sink(night, where)
        self.check_charges(where)

    def check_sink(self, night: Night, where: str) -> None:
        import lancedb

        held = lancedb.connect(self.tmp / "db").open_table("t").to_arrow().to_pylist()
        by_id = {r["id"]: r for r in held}
        assert len(held) == len(by_id), f"an id twice in the sink\n{where}"
        assert sorted(by_id) == sorted(r[0] for r in night.rows), f"sink ids differ\n{where}"
        got = np.stack([np.asarray(by_id[r[0]]["embedding"], np.float32) for r in night.rows])
        truth = expected_matrix([r[1] for r in night.rows])
        assert np.allclose(got, truth, rtol=1e-6, atol=1e-7), f"sink vectors differ\n{where}"
        held_sections = {i: r["section"] for i, r in by_id.items()}
        assert held_sections == {r[0]: r[2] for r in night.rows}, f"sink kept column\n{where}"

    def check_charges(self, where: str) -> None:
        charged = self.server.charged_texts()
        twice = {h: n for h, n in charged.items() if n > (2 if h in self.may_repeat else 1)}
        assert not twice, f"{len(twice)} texts charged more than once\n{where}"


def run_sequence(tmp: Path, seed: int, nights: int) -> int:
    """Run one seed's sequence, checking after every night; return the nights run."""
    tmp.mkdir(parents=True, exist_ok=True)
    gen = Generator(seed)
    sequence = gen.sequence(nights)
    with FakeEmbeddingServer(dims=384) as server:
        world = World(tmp, server, seed)
        for night in sequence:
            if any(night is n.overlap for n in sequence):
                continue  # run with the night it overlaps
            world.run_night(night, gen.rng)
    repeats = sum(1 for n in server.charged_texts().values() if n > 1)
    world.steps.append(f"{repeats} texts charged twice, each in flight at a kill")
    print(world.where())  # shown with -rP, or in the report when a later check fails
    return len(sequence)


def _report(record: Any, seeds: list[int], nights: int) -> None:
    """Record how many sequences and nights ran (shown in the terminal summary)."""
    record(
        "summary",
        f"pipeline property: {len(seeds)} sequences (seed{'s' * (len(seeds) > 1)} "
        f"{', '.join(map(str, seeds))}), "
        f"{nights} nights, every invariant held",
    )


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_random_nights_keep_output_and_sink_exact_and_pay_each_text_once(
    tmp_path: Path, seed: int, record_property: Any
) -> None:
    _report(record_property, [seed], run_sequence(tmp_path, seed, CI_NIGHTS))


def _soak_seeds() -> list[int]:
    spec = os.environ.get("EMBEDLINE_PROPERTY_SEEDS", "20")
    if "," in spec or not spec.isdigit():
        return [int(s) for s in spec.split(",") if s.strip()]
    return list(range(1000, 1000 + int(spec)))


@pytest.mark.slow
def test_random_nights_soak(tmp_path: Path, record_property: Any) -> None:
    """Many more seeds and nights: ``EMBEDLINE_PROPERTY_SEEDS=N`` runs seeds 1000 to
    1000 + N - 1, ``EMBEDLINE_PROPERTY_SEEDS=17,`` replays seed 17 alone."""
    nights_each = int(os.environ.get("EMBEDLINE_PROPERTY_NIGHTS", "8"))
    seeds, total = _soak_seeds(), 0
    for seed in seeds:
        total += run_sequence(tmp_path / f"seed-{seed}", seed, nights_each)
    _report(record_property, seeds, total)
