"""BERT's uncased WordPiece tokenizer, as `tokenizer.json` of all-MiniLM-L6-v2 describes it, in
Python: the vocabulary as one dict (3.7 MiB) instead of the Rust `tokenizers` package (5.3 MiB of
RSS to import it, 7.1 more to load this tokenizer; docs/design.md, "Tool search").

What it does, in the order the Rust tokenizer does it: the added (special) tokens are matched in
the raw text first (they are not normalized); each other span is normalized as `BertNormalizer`
does (control characters dropped, whitespace made a space, CJK ideographs spaced out, accents
stripped, lowercased), split on whitespace and punctuation (`BertPreTokenizer`), and each word is
split greedily into the longest word pieces of the vocabulary (`##` before a continuation; a word
with no split, or over 100 characters, is `[UNK]`). The ids are wrapped in `[CLS]` ... `[SEP]`
and cut to `max_tokens` with them. Checked id for id against `tokenizers` on both labelled
corpora's tool texts and queries and on odd text (tests/unit/test_search_wordpiece.py).
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Any

_CONTINUATION = "##"


def _is_whitespace(c: str) -> bool:
    return c in " \t\n\r" or c.isspace()


def _is_control(c: str) -> bool:
    return c not in "\t\n\r" and unicodedata.category(c).startswith("C")


def _is_punctuation(c: str) -> bool:
    o = ord(c)
    if 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def _is_cjk(o: int) -> bool:
    return (
        0x4E00 <= o <= 0x9FFF
        or 0x3400 <= o <= 0x4DBF
        or 0x20000 <= o <= 0x2A6DF
        or 0x2A700 <= o <= 0x2B73F
        or 0x2B740 <= o <= 0x2B81F
        or 0x2B920 <= o <= 0x2CEAF
        or 0xF900 <= o <= 0xFAFF
        or 0x2F800 <= o <= 0x2FA1F
    )


def normalize(text: str) -> str:
    """`BertNormalizer(clean_text, handle_chinese_chars, strip_accents, lowercase)`."""
    out: list[str] = []
    for c in text:
        if c == "\0" or c == "\ufffd" or _is_control(c):
            continue
        if _is_whitespace(c):
            out.append(" ")
        elif _is_cjk(ord(c)):
            out.append(f" {c} ")
        else:
            out.append(c)
    decomposed = unicodedata.normalize("NFD", "".join(out))
    stripped = "".join(c for c in decomposed if unicodedata.category(c) != "Mn")
    # Character by character, as Rust's `to_lowercase` of each char: `str.lower` alone makes a
    # word-final capital sigma a final sigma (its only context-dependent mapping).
    return stripped.lower() if "\u03a3" not in stripped else "".join(c.lower() for c in stripped)


def pre_tokenize(text: str) -> list[str]:
    """`BertPreTokenizer`: words split on whitespace, each punctuation character a word."""
    words: list[str] = []
    current: list[str] = []
    for c in text:
        if c.isspace():
            if current:
                words.append("".join(current))
                current = []
        elif _is_punctuation(c):
            if current:
                words.append("".join(current))
                current = []
            words.append(c)
        else:
            current.append(c)
    if current:
        words.append("".join(current))
    return words


class WordPiece:
    """`encode(text)` -> the token ids of `[CLS] text [SEP]`, at most `max_tokens` of them."""

    def __init__(
        self,
        vocab: dict[str, int],
        specials: dict[str, int],
        *,
        unk: str = "[UNK]",
        cls: str = "[CLS]",
        sep: str = "[SEP]",
        max_tokens: int = 128,
        max_word_chars: int = 100,
    ) -> None:
        self._vocab = vocab
        self._specials = specials
        self._unk = vocab[unk]
        self._cls = vocab[cls]
        self._sep = vocab[sep]
        self._max_tokens = max_tokens
        self._max_word_chars = max_word_chars
        self._split_specials = (
            re.compile("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")
            if specials
            else None
        )

    @classmethod
    def from_file(cls, path: Path, max_tokens: int = 128) -> WordPiece:
        """From a `tokenizer.json` of a BERT WordPiece model."""
        data: dict[str, Any] = json.loads(path.read_text())
        model = data["model"]
        if model.get("type") != "WordPiece" or data["normalizer"].get("type") != "BertNormalizer":
            raise ValueError(f"{path} is not a BERT WordPiece tokenizer")
        vocab = {str(k): int(v) for k, v in model["vocab"].items()}
        specials = {str(t["content"]): int(t["id"]) for t in data.get("added_tokens", [])}
        return cls(
            vocab,
            specials,
            unk=str(model["unk_token"]),
            max_tokens=max_tokens,
            max_word_chars=int(model["max_input_chars_per_word"]),
        )

    def _word_ids(self, word: str) -> tuple[int, ...]:
        if len(word) > self._max_word_chars:
            return (self._unk,)
        ids: list[int] = []
        start = 0
        while start < len(word):
            end = len(word)
            found = None
            while start < end:
                piece = word[start:end] if start == 0 else _CONTINUATION + word[start:end]
                found = self._vocab.get(piece)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return (self._unk,)
            ids.append(found)
            start = end
        return tuple(ids)

    def encode(self, text: str) -> list[int]:
        spans = self._split_specials.split(text) if self._split_specials is not None else [text]
        ids: list[int] = []
        limit = self._max_tokens - 2
        for k, span in enumerate(spans):
            if k % 2 == 1 and self._split_specials is not None:
                ids.append(self._specials[span])
            else:
                for word in pre_tokenize(normalize(span)):
                    ids.extend(self._word_ids(word))
            if len(ids) >= limit:
                break
        return [self._cls, *ids[:limit], self._sep]
