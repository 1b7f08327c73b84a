"""Request sizes: the token estimate that batches and the TPM pacer use, and the
per-request caps learned from a server that refuses large requests.

Rule source: OpenAI help center, "What are tokens and how to count them?" (about 4
characters per English token); OpenAI rate-limits guide for TPM.
"""

from __future__ import annotations

import logging
import math
import re
import threading

from adapters.embeddings.common import HTTP_LOGGER, Logger

__all__ = ["RequestCaps", "approximate_tokens", "estimate_tokens"]


def estimate_tokens(text: str) -> int:
    """Return a conservative token estimate for ``text``: ``ceil(utf8_bytes / 3)``, at least 1.

    English averages about 4 characters per token (OpenAI help center, "What are tokens and
    how to count them?"); CJK text is about one token per character, 3 bytes each in UTF-8.
    Dividing bytes by 3 over-estimates English and matches CJK, so a batch sized with it
    stays under a per-request token limit without shipping a tokenizer. The TPM pacer books
    this estimate before a request and corrects it with the server's ``usage`` afterwards.
    """
    return max(1, math.ceil(len(text.encode("utf-8")) / 3))


#: Kana, CJK ideographs, Hangul and full-width forms: about one token per character.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
#: One match per token a BPE tokenizer (cl100k_base) makes, roughly.
_PIECES = re.compile(
    r"[A-Za-z]{1,9}"  # a Latin word: one token, one more per 9 letters
    r"|[0-9]{1,3}"  # a number: one token per 3 digits
    r"|[!-/:-@\[-`{-~]"  # ASCII punctuation: one each
    rf"|[{_CJK}]"  # kana, CJK, Hangul: one each
    rf"|[^\x00-\x7f{_CJK}\s]{{1,2}}"  # other scripts: one per 2 characters
)


def approximate_tokens(text: str) -> int:
    """Return a central token estimate for ``text`` (at least 1): what a BPE tokenizer
    would count, by script, without one.

    Latin words count one token per 9 letters (rounded up), numbers one per 3 digits, ASCII
    punctuation and each kana/CJK/Hangul character one, other scripts one per 2 characters.
    Against ``cl100k_base`` (OpenAI's tokenizer for its embedding models) it comes within
    about 7 % on English and on Japanese prose (benchmarks/LOG.md); unlike ``estimate_tokens``
    it may count below a tokenizer, so it sizes no request: the dry run uses it (and
    calibrates it with the server's ``usage``, ``embedline.calibration``).
    """
    return max(1, len(_PIECES.findall(text)))


class RequestCaps:
    """Per-request limits learned from the server, kept for the rest of the run; thread-safe.

    Some servers cap the inputs (TEI's ``--max-client-batch-size``, Gemini's 100 or 250) or
    the tokens of one request and answer a 4xx above it. When a rejected batch was then
    embedded whole in smaller requests (no row was at fault), the largest request that
    worked becomes the cap, so later batches do not pay the same 4xx and bisection again.
    Caps only ever shrink. ``max_inputs`` in inputs, ``max_tokens`` in estimated tokens
    (``estimate_tokens``); None means no learned cap.
    """

    def __init__(self, *, logger: Logger | None = None) -> None:
        self._lock = threading.Lock()
        self._logger: Logger = logger or logging.getLogger(HTTP_LOGGER)
        self.max_inputs: int | None = None
        self.max_tokens: int | None = None

    def limits(self, batch_size: int, max_request_tokens: int) -> tuple[int, int]:
        """Return (inputs, tokens) per request: the settings, lowered by learned caps."""
        with self._lock:
            inputs, tokens = self.max_inputs, self.max_tokens
        return min(batch_size, inputs or batch_size), min(
            max_request_tokens, tokens or max_request_tokens
        )

    def learn(self, *, rejected: int, inputs: int, tokens: int | None, status: int | None) -> None:
        """Record that a request of ``rejected`` inputs was refused (HTTP ``status``) while
        requests of up to ``inputs`` inputs (and ``tokens`` estimated tokens, when the
        server named tokens as the limit) worked. Logged once per change."""
        with self._lock:
            changed = self.max_inputs is None or inputs < self.max_inputs
            if changed:
                self.max_inputs = inputs
            if tokens is not None and (self.max_tokens is None or tokens < self.max_tokens):
                self.max_tokens, changed = tokens, True
            max_inputs, max_tokens = self.max_inputs, self.max_tokens
        if changed:
            self._logger.warning(
                "the server refused a request of %d inputs (HTTP %s) but accepted its rows in "
                "smaller requests: sending at most %d inputs%s per request from now on",
                rejected,
                status,
                max_inputs,
                f" and {max_tokens} estimated tokens" if max_tokens else "",
            )
