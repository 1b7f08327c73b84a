"""Reuse-index lookups: ``Ledger.find_vectors`` (one query per 500 texts) against one query
per text, the way it was until f5927a2, on the same ledger in one run.

The index holds ``--objects`` chunk objects of ``--rows`` texts, each text in ``--copies``
objects (reruns over an edited file add objects holding the same texts). Each round looks up
a chunk's worth (``--lookup``) of random texts. Prints ms per lookup and the ratio::

    python benchmarks/bench_reuse_index.py [--objects 64] [--rows 1000] [--copies 3]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.ledger import Ledger  # noqa: E402


def per_text(ledger: Ledger, hashes: list[str]) -> dict[str, str]:
    """The previous lookup: one point query per text (first indexed object wins)."""
    found = {}
    for text_hash in dict.fromkeys(hashes):
        row = ledger._conn.execute(
            """SELECT o.object_key FROM reuse_texts t
               JOIN reuse_objects o ON o.object_id = t.object_id
               WHERE t.text_sha256 = ? AND o.output_uri = ? AND o.model = ?
                 AND o.dimensions = ? ORDER BY o.object_id LIMIT 1""",
            (bytes.fromhex(text_hash), "/out", "m", "")).fetchone()
        if row is not None:
            found[text_hash] = row[0]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--lookup", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    texts = args.objects * args.rows
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(texts)]
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(str(Path(tmp) / "ledger.sqlite3"))
        for copy in range(args.copies):
            order = hashes if copy % 2 == 0 else hashes[::-1]
            for i in range(args.objects):
                ledger.index_object("/out", f"chunks/{copy}-{i}.parquet", model="m",
                                    dimensions="",
                                    text_hashes=order[i * args.rows:(i + 1) * args.rows])
        rng = random.Random(1)
        rounds = [rng.sample(hashes, args.lookup) for _ in range(args.rounds)]
        results = {}
        for name, lookup in (
            ("one query per text", lambda hs: per_text(ledger, hs)),
            ("find_vectors", lambda hs: ledger.find_vectors("/out", model="m", dimensions="",
                                                            text_hashes=hs)),
        ):
            started = time.perf_counter()
            answers = [lookup(hs) for hs in rounds]
            results[name] = (time.perf_counter() - started) / args.rounds * 1000, answers
        ledger.close()
    (slow, want), (fast, got) = results["one query per text"], results["find_vectors"]
    print(f"{args.objects * args.copies} objects indexed, {texts:,} distinct texts, "
          f"{args.lookup} texts per lookup")
    for name, (ms, _) in results.items():
        print(f"  {name:<20} {ms:7.1f} ms per lookup")
    print(f"  ratio {slow / fast:.1f}x; same answers: {want == got}")
    return 0 if want == got else 1


if __name__ == "__main__":
    sys.exit(main())
