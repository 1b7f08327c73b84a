"""CSV format sniffing: encoding, line ends and delimiter, from an input's first MiB.

Once per input (``sniff_format``): a BOM decides UTF-8 or UTF-16; ``--encoding auto``
without a BOM takes UTF-8 if the sample decodes strictly, else the encoding
charset-normalizer names (a single-byte code page it cannot confirm is refused, naming how
one byte reads in each); the newline is ``\n`` unless the sample has only ``\r``;
``--delimiter auto`` tries ``,`` ``;`` TAB ``|`` on the header line and keeps the first that
yields both the id and the text column. A first line ``sep=X`` (the hint Excel writes and
reads) names the delimiter instead, and the header is the line after it. What was chosen is
reported (``CsvFormat.note``).
A ZIP or xlsx file, or gzip bytes without the ``.gz`` suffix, is refused naming what it is.
Reading records in that format is ``adapters.csv_records``.
"""

from __future__ import annotations

import codecs
import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import BinaryIO, Literal

from embedline.errors import InputError

__all__ = ["QUOTING", "CsvFormat", "single_byte_codec", "sniff_format", "sniff_stream"]

_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = {b"\xff\xfe": "utf-16-le", b"\xfe\xff": "utf-16-be"}
_SNIFF_BYTES = 1 << 20
_DELIMITERS = (",", ";", "\t", "|")
_SEP_LINE = re.compile(r"sep=([^\r\n\"])\r?")  # Excel's delimiter hint, the whole first line
#: ``--quoting``: ``minimal`` reads quoted fields as RFC 4180 does (a field may be quoted to
#: hold delimiters, line breaks and doubled quotes); ``none`` splits on the delimiter only,
#: quotes are literal characters and a record ends at its line's end.
QUOTING: Mapping[str, Literal[0, 1, 2, 3]] = MappingProxyType(
    {"minimal": csv.QUOTE_MINIMAL, "none": csv.QUOTE_NONE}
)


@dataclass(frozen=True, slots=True)
class CsvFormat:
    """How an input's bytes become records: ``codec`` decodes each line (no BOM),
    ``newline`` ends a line (``"\n"`` or ``"\r"``), ``delimiter`` separates fields, ``bom``
    bytes at the start are skipped; ``note`` says what was detected (empty: all defaults);
    ``quoting`` is a ``QUOTING`` name; ``sep_line``: the first line is Excel's ``sep=X``
    (the delimiter), not the header."""

    codec: str
    newline: str = "\n"
    delimiter: str = ","
    bom: int = 0
    note: str = ""
    quoting: str = "minimal"
    sep_line: bool = False

    @property
    def csv_quoting(self) -> Literal[0, 1, 2, 3]:
        """The ``csv`` module's constant for ``quoting``."""
        return QUOTING[self.quoting]


def sniff_format(
    head: bytes,
    *,
    encoding: str,
    delimiter: str,
    path: str,
    id_column: str,
    text_column: str,
    quoting: str = "minimal",
) -> CsvFormat:
    """Decide codec, newline and delimiter from the input's first bytes (see module doc).

    ``encoding`` is ``auto`` or a Python codec name; ``delimiter`` is ``auto`` or one
    character; ``quoting`` a ``QUOTING`` name, kept in the format.

    :raises InputError: a binary format (ZIP/xlsx, gzip without ``.gz``), a BOM that
        contradicts ``--encoding``, bytes no detector can name, or a ``sep=X`` first line
        that contradicts ``--delimiter``.
    """
    _refuse_binary(head, path)
    codec, bom, notes = _sniff_codec(head, encoding, path)
    text = head[bom:].decode(codec, errors="replace")
    crlf = text.count("\r\n")
    lone_cr, lone_lf = text.count("\r") - crlf, text.count("\n") - crlf
    newline = "\r" if lone_cr > lone_lf else "\n"  # \n may still occur inside quoted fields
    if newline == "\r":
        notes.append("line ends: CR only")
    header = text.split(newline, 1)[0]
    sep = _SEP_LINE.fullmatch(header)
    if sep:
        if delimiter not in ("auto", sep.group(1)):
            raise InputError(
                f"the first line {header.rstrip()!r} (Excel's delimiter hint) names "
                f"{sep.group(1)!r} but --delimiter is {delimiter!r}; pass --delimiter auto "
                "(the line is then read as the delimiter, and the header is the next line)",
                path=path,
                line=1,
            )
        delimiter = sep.group(1)
        notes.append(f"delimiter {delimiter!r} (from the 'sep=' first line; the header is line 2)")
    elif delimiter == "auto":
        delimiter = _sniff_delimiter(header, id_column, text_column, QUOTING[quoting])
        if delimiter != ",":
            notes.append(f"delimiter {delimiter!r} (found in the header)")
    if quoting != "minimal":
        notes.append(f"quoting {quoting}: fields split on the delimiter only, quotes kept")
    return CsvFormat(codec, newline, delimiter, bom, "; ".join(notes), quoting, bool(sep))


def _refuse_binary(head: bytes, path: str) -> None:
    if head.startswith(b"\x1f\x8b"):
        raise InputError(
            "the file is gzip-compressed but its name does not end in .gz; "
            "rename it to ….csv.gz (it is then read as a stream)",
            path=path,
        )
    if head.startswith(b"PK\x03\x04"):
        raise InputError(
            "the file is a ZIP archive (an .xlsx workbook?), not CSV text; "
            "export it as CSV (UTF-8) first",
            path=path,
        )


def _sniff_codec(head: bytes, encoding: str, path: str) -> tuple[str, int, list[str]]:
    """Return (codec for each line, BOM bytes to skip, notes)."""
    wanted = encoding.lower().replace("_", "-")
    for bom, codec in _UTF16_BOMS.items():
        if head.startswith(bom):
            if wanted not in ("auto", "utf-16", codec):
                raise InputError(
                    f"the file starts with a {codec.upper()} byte-order mark but "
                    f"--encoding is {encoding}; pass --encoding auto",
                    path=path,
                    line=1,
                )
            return codec, 2, [f"encoding {codec} (byte-order mark)"]
    if wanted == "utf-16":
        raise InputError(
            "--encoding utf-16 needs a byte-order mark, and the file has none; "
            "pass utf-16-le or utf-16-be",
            path=path,
            line=1,
        )
    if wanted != "auto":
        name = codecs.lookup(encoding).name
        name = "utf-8" if name == "utf-8-sig" else name
        return name, 3 if name == "utf-8" and head.startswith(_UTF8_BOM) else 0, []
    if head.startswith(_UTF8_BOM):
        return "utf-8", 3, []
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        return "utf-8", 0, []
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(head).best()
    if best is None or "\n".encode(best.encoding) != b"\n":
        raise InputError(
            "the file is not UTF-8 and its encoding could not be detected; "
            "pass --encoding with its real encoding (e.g. cp932, latin-1)",
            path=path,
            line=1,
        )
    codec = codecs.lookup(best.encoding).name
    if single_byte_codec(codec) or _katakana_garbage(head, codec):
        _refuse_guessed_code_page(head, codec, path)
    return (
        codec,
        0,
        [f"encoding {codec} (detected by charset-normalizer; pass --encoding to override)"],
    )


#: Single-byte code pages CSV exports really use, shown when refusing a guess: one byte
#: reads differently in each (https://www.unicode.org/Public/MAPPINGS/VENDORS/MICSFT/).
_CODE_PAGES = {
    "cp1252": "Windows Western",
    "iso8859-15": "ISO Western",
    "cp1250": "Windows Central European",
    "cp1251": "Windows Cyrillic",
    "koi8-r": "KOI8 Cyrillic",
    "cp1257": "Windows Baltic",
    "cp1254": "Windows Turkish",
    "cp850": "DOS Western",
}


def single_byte_codec(codec: str) -> bool:
    """A one-byte-per-character code page (Python implements those as a charmap with a
    ``decoding_table``): cp125x, ISO 8859, KOI8, DOS, Mac. Multi-byte ones (cp932,
    GB18030, Big5, EUC) have a byte structure a detector can check; single-byte ones do
    not: charset-normalizer 3 read French cp1252 as cp1250 ("crème" became "crčme"),
    Lithuanian cp1257 as cp1251, Turkish cp1254 as KOI8-R, DOS cp850 as cp1252."""
    import importlib

    module = importlib.import_module(codecs.lookup(codec).incrementaldecoder.__module__)
    return hasattr(module, "decoding_table")


def _katakana_garbage(head: bytes, codec: str) -> bool:
    """A Shift-JIS/EUC-JP guess that decodes to mostly half-width katakana (U+FF61-FF9F):
    the single-byte letters of KOI8-R or cp1251 text read as Shift-JIS single bytes
    ("Привет" became "ﾐﾒﾉﾗﾅﾔ"), not Japanese, whose text is mostly kana and kanji."""
    if "jis" not in codec and codec != "cp932":
        return False
    wide = [c for c in head.decode(codec, errors="replace") if ord(c) > 0x7F]
    return bool(wide) and sum("\uff61" <= c <= "\uff9f" for c in wide) > len(wide) / 2


def _refuse_guessed_code_page(head: bytes, detected: str, path: str) -> None:
    """Refuse a code page detection cannot confirm: any choice could silently change texts,
    and so their vectors. The message shows how the first non-ASCII byte that code pages
    disagree on reads in each, so the user can pick ``--encoding``.

    :raises InputError: always; naming the byte's line.
    """
    guess = _CODE_PAGES.get(detected)
    pages = {
        detected: f"{guess}, the detector's guess" if guess else "the detector's guess",
        **{c: what for c, what in _CODE_PAGES.items() if c != detected},
    }
    offset = next(
        (
            i
            for i, b in enumerate(head)
            if b >= 0x80 and len({bytes([b]).decode(c, errors="replace") for c in _CODE_PAGES}) > 1
        ),
        None,
    )
    offset = offset if offset is not None else next(i for i, b in enumerate(head) if b >= 0x80)
    byte = head[offset : offset + 1]
    ways = ", ".join(f"{_reading(head, offset, c)} in {c} ({what})" for c, what in pages.items())
    raise InputError(
        f"the file is not UTF-8, and its code page cannot be told from its bytes: byte "
        f"0x{byte[0]:02X} reads: {ways}. Pass --encoding with the code page it was exported "
        f"in (one of those, or another Python codec name), or export it as UTF-8",
        path=path,
        line=head.count(b"\n", 0, offset) + 1,
    )


_WORD_ENDS = (b" ", b",", b";", b"\t", b"|", b'"', b"\n", b"\r")


def _reading(head: bytes, offset: int, codec: str) -> str:
    """The word around ``offset`` decoded as ``codec`` (a byte alone can be half a
    multi-byte character)."""
    start = max([head.rfind(sep, 0, offset) for sep in _WORD_ENDS] + [offset - 13]) + 1
    ends = [i for i in (head.find(sep, offset) for sep in _WORD_ENDS) if i != -1]
    end = min([*ends, offset + 12])
    return head[start:end].decode(codec, errors="replace")


def _sniff_delimiter(
    header: str, id_column: str, text_column: str, quoting: Literal[0, 1, 2, 3] = 0
) -> str:
    """The first of , ; TAB | that splits ``header`` into fields holding both columns; else
    the one giving most fields; else ``,`` (the header check then names what it found)."""
    best, most = ",", 1
    for candidate in _DELIMITERS:
        try:
            fields = next(csv.reader([header], delimiter=candidate, quoting=quoting), [])
        except csv.Error:
            continue
        if id_column in fields and text_column in fields:
            return candidate
        if len(fields) > most:
            best, most = candidate, len(fields)
    return best


def sniff_stream(
    fh: BinaryIO,
    path: str,
    encoding: str,
    delimiter: str,
    id_column: str,
    text_column: str,
    quoting: str = "minimal",
) -> CsvFormat:
    """``sniff_format`` on the first MiB of ``fh`` (a buffered reader), peeked, not consumed.

    :raises InputError: as ``sniff_format``.
    """
    head = fh.peek(_SNIFF_BYTES)[:_SNIFF_BYTES]  # type: ignore[attr-defined]  # BufferedReader
    return sniff_format(
        head,
        encoding=encoding,
        delimiter=delimiter,
        path=path,
        id_column=id_column,
        text_column=text_column,
        quoting=quoting,
    )
