"""BERT's uncased WordPiece tokenizer, as `tokenizer.json` of all-MiniLM-L6-v2 describes it, in
Python: the vocabulary as one dict (3.7 MiB) instead of the Rust `tokenizers` package (5.3 MiB of
RSS to import it, 7.1 more to load this tokenizer; docs/design.md, "Tool search").

What it does, in the order the Rust tokenizer does it: the added (special) tokens are matched in
the raw text first (they are not normalized); each other span is normalized as `BertNormalizer`
does (control characters dropped: Cc, Cf, Co, Cs, not unassigned Cn; whitespace made a space;
CJK ideographs spaced out; accents stripped; lowercased), split on whitespace and punctuation (`BertPreTokenizer`), and each word is
split greedily into the longest word pieces of the vocabulary (`##` before a continuation; a word
with no split, or over `max_input_chars_per_word` characters, is `[UNK]`). The ids are wrapped in
`[CLS]` ... `[SEP]` and cut to `max_tokens` with them; the words after the cut are not split.
`from_file` refuses a `tokenizer.json` with settings this module does not implement. Checked id
for id against `tokenizers` on both labelled corpora's tool texts and queries, on odd text and
on every code point of the BMP and U+1F000-1FFFF as "a<c>b" (tests/registry/search/test_search_wordpiece.py).

Limit: character classes come from the interpreter's `unicodedata` (Unicode 14.0.0 on Python
3.11), and `tokenizers`' come from older tables. On a code point whose category differs between
the two (assigned or re-categorized between their versions: 114 in the BMP and U+1F000-1FFFF,
all of them marks, punctuation or format characters, and 503 in all of Unicode) the ids differ;
another interpreter's Unicode version moves that set.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_CONTINUATION = "##"


def _is_whitespace(c: str) -> bool:
    return c in " \t\n\r" or c.isspace()


_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs"})


def _is_control(c: str) -> bool:
    """`is_control` of tokenizers' `normalizers/bert.rs`: "other" but not unassigned (Cn), which
    stays in the text (and makes its word `[UNK]`); tab, newline and return count as whitespace."""
    return c not in "\t\n\r" and unicodedata.category(c) in _CONTROL_CATEGORIES


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


def pre_tokenize(text: str) -> Iterator[str]:
    """`BertPreTokenizer`: words split on whitespace, each punctuation character a word (lazily,
    so that `encode` stops splitting once it has its tokens)."""
    current: list[str] = []
    for c in text:
        if c.isspace():
            if current:
                yield "".join(current)
                current = []
        elif _is_punctuation(c):
            if current:
                yield "".join(current)
                current = []
            yield c
        else:
            current.append(c)
    if current:
        yield "".join(current)


_NORMALIZER = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "lowercase": True}
# What this module does with an added token: matched as is in the raw text, anywhere, not
# normalized, no whitespace stripped around it.
_ADDED_TOKEN = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}


def _single_template(processor: dict[str, Any]) -> list[str]:
    if processor.get("type") == "BertProcessing":
        return [str(processor["cls"][0]), "A", str(processor["sep"][0])]
    if processor.get("type") == "TemplateProcessing":
        return [str(next(iter(piece.values()))["id"]) for piece in processor.get("single", [])]
    return []


def _check_supported(data: dict[str, Any], path: Path) -> None:
    """Refuse a `tokenizer.json` whose settings this module does not implement, rather than give
    other ids than `tokenizers` would."""
    model = data.get("model") or {}
    normalizer = data.get("normalizer") or {}
    unsupported: list[str] = []
    if model.get("type") != "WordPiece":
        unsupported.append(f"model type {model.get('type')!r}")
    if model.get("continuing_subword_prefix", _CONTINUATION) != _CONTINUATION:
        unsupported.append(f"continuing_subword_prefix {model['continuing_subword_prefix']!r}")
    for key, value in _NORMALIZER.items():
        if normalizer.get(key) != value:
            unsupported.append(f"normalizer {key} {normalizer.get(key)!r}")
    # null: strip accents when lowercasing, as BertNormalizer does.
    if normalizer.get("strip_accents") not in (None, True):
        unsupported.append(f"normalizer strip_accents {normalizer.get('strip_accents')!r}")
    if (data.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        unsupported.append("pre_tokenizer other than BertPreTokenizer")
    if _single_template(data.get("post_processor") or {}) != ["[CLS]", "A", "[SEP]"]:
        unsupported.append("post_processor other than [CLS] A [SEP]")
    for token in data.get("added_tokens", []):
        for key, value in _ADDED_TOKEN.items():
            if token.get(key, value) != value:
                unsupported.append(f"added token {token.get('content')!r} {key} {token.get(key)!r}")
    if unsupported:
        raise ValueError(
            f"{path} is not a BERT WordPiece tokenizer this module implements: " + "; ".join(unsupported)
        )


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
        # No piece is longer than the longest entry: the prefix search starts there, not at the
        # word's end (the same greedy longest match, without trying prefixes that cannot match).
        self._max_piece_chars = max((len(k) for k in vocab), default=0)
        self._split_specials = (
            re.compile("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")
            if specials
            else None
        )

    @classmethod
    def from_file(cls, path: Path, max_tokens: int = 128) -> WordPiece:
        """From a `tokenizer.json` of a BERT WordPiece model."""
        data: dict[str, Any] = json.loads(path.read_text())
        _check_supported(data, path)
        model = data["model"]
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
            end = min(len(word), start + self._max_piece_chars)
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
            if len(ids) >= limit:
                break
        return [self._cls, *ids[:limit], self._sep]
