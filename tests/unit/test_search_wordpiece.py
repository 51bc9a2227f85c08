"""The Python WordPiece tokenizer gives the ids the Rust `tokenizers` package gives for the
bundled model's `tokenizer.json` (the encoder used that package before; vectors must not move)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer
from toolbus_registry.search import SearchIndex
from toolbus_registry.search.encoder import DEFAULT_MAX_TOKENS, bundled_model_directory
from toolbus_registry.search.wordpiece import WordPiece

from tests.search.labelled import load_queries, load_tools, load_twilio_tasks

ODD_TEXTS = [
    "Café naïve résumé",
    "日本語のテキスト 中文",
    "emoji 😀 test",
    "ctrl\x00\x07char\u200bzw\ufffd",
    "[MASK] and [CLS]x[SEP] [UNK]",
    "a\u2028b\u00a0c\u3000d\u0085e\u2029f",
    "İstanbul ΣΊΣΥΦΟΣ σοφός",
    "x" * 150,
    "unaffable don't stop-believing!!",
    "",
    "   ",
    "Ｆｕｌｌｗｉｄｔｈ ﬁle Ωmega ℃ ½",
    "tab\there\r\nnew",
    "word " * 200,
]


@pytest.fixture(scope="module")
def both() -> tuple[Tokenizer, WordPiece]:
    path = bundled_model_directory() / "tokenizer.json"
    rust = Tokenizer.from_file(str(path))
    rust.enable_truncation(max_length=DEFAULT_MAX_TOKENS)
    rust.no_padding()
    return rust, WordPiece.from_file(path, DEFAULT_MAX_TOKENS)


def test_odd_text_and_the_labelled_queries_tokenize_as_with_tokenizers(
    both: tuple[Tokenizer, WordPiece],
) -> None:
    rust, python = both
    texts = ODD_TEXTS + [q.query for q in load_queries()] + [q.query for q in load_twilio_tasks()]
    assert [python.encode(t) for t in texts] == [rust.encode(t).ids for t in texts]


def test_tool_texts_tokenize_as_with_tokenizers(both: tuple[Tokenizer, WordPiece]) -> None:
    try:
        tools = load_tools()
    except LookupError as exc:
        pytest.skip(f"npm MCP catalogues unavailable: {exc}")
    rust, python = both
    texts = [*SearchIndex.build(tools).embedding_texts, *(t.description for t in tools)]
    assert [python.encode(t) for t in texts] == [rust.encode(t).ids for t in texts]
