"""Identifier splitting, stemming, stop words and synonym expansion of tool search."""

from __future__ import annotations

import pytest
from toolbus_registry.search.stemmer import stem
from toolbus_registry.search.text import (
    STOP_WORDS,
    SYNONYMS,
    expand,
    request_action,
    split_identifier,
    terms,
    tool_action,
)


@pytest.mark.parametrize(
    ("identifier", "words"),
    [
        ("list_issues", ["list", "issues"]),
        ("listIssues", ["list", "issues"]),
        ("API-get-user", ["api", "get", "user"]),
        ("github.create_pull_request", ["github", "create", "pull", "request"]),
        ("getHTTPResponse2x", ["get", "http", "response", "2", "x"]),
        ("browser_take_screenshot", ["browser", "take", "screenshot"]),
        ("gzip-file-as-resource", ["gzip", "file", "as", "resource"]),
        ("Close the page.", ["close", "the", "page"]),
    ],
)
def test_split_identifier_breaks_snake_camel_kebab_and_dots(identifier: str, words: list[str]) -> None:
    assert split_identifier(identifier) == words


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        # From Porter's paper and its published test vocabulary.
        ("caresses", "caress"),
        ("ponies", "poni"),
        ("agreed", "agre"),
        ("motoring", "motor"),
        ("hopping", "hop"),
        ("filing", "file"),
        ("relational", "relat"),
        ("generalization", "gener"),
        ("adjustment", "adjust"),
        ("controll", "control"),
    ],
)
def test_stem_follows_porter(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_inflections_meet_on_one_stem() -> None:
    assert stem("creating") == stem("created") == stem("create")
    assert stem("issues") == stem("issue")
    assert stem("directories") == stem("directory")


def test_terms_drop_stop_words_and_stem() -> None:
    assert terms("Close an issue in my repositories") == ["close", "issu", "repositori"]
    assert terms("create_issue") == terms("creating issues")


def test_synonyms_are_symmetric_and_stemmed() -> None:
    assert stem("folder") in SYNONYMS[stem("directory")]
    assert stem("directory") in SYNONYMS[stem("folder")]
    assert stem("remove") in SYNONYMS[stem("delete")]


def test_expand_gives_one_group_per_query_word_with_weighted_synonyms() -> None:
    groups = expand(terms("remove folder"), synonym_weight=0.4)
    assert len(groups) == 2
    remove, folder = groups
    assert remove[stem("remove")] == 1.0
    assert remove[stem("delete")] == 0.4
    assert folder[stem("directory")] == 0.4
    # A synonym the query holds itself keeps its full weight in its own group.
    both = expand(terms("delete remove"), synonym_weight=0.4)
    assert stem("remove") not in both[0]
    assert both[1][stem("remove")] == 1.0


@pytest.mark.parametrize(
    ("name", "action"),
    [
        ("CreateMessage", "create"),
        ("list_issues", "list"),
        ("FetchCall", "fetch"),
        ("API-patch-page", "update"),
        ("API-delete-a-block", "delete"),
        ("browser_close", None),
        ("get-sum", "fetch"),
    ],
)
def test_tool_action_is_the_verb_its_name_starts_with(name: str, action: str | None) -> None:
    assert tool_action(name) == action


@pytest.mark.parametrize(
    ("query", "action"),
    [
        ("cancel a pending verification", "update"),
        ("which message templates can verification codes use", "list"),
        ("how many calls did we get last week", "list"),
        ("release a phone number we no longer need", "delete"),
        ("send an SMS to a customer", "create"),
        ("look up a phone number", "fetch"),
        ("show me the open issues of a repository", None),  # "show" and "open" name no action
        ("take a screenshot", None),
    ],
)
def test_request_action_reads_the_action_a_request_asks_for(query: str, action: str | None) -> None:
    assert request_action(query) == action


@pytest.mark.parametrize(
    "text",
    [
        "getHTTPResponse2x and HTTPServer2, API-get-user",
        "Retrieve a list of all Calls made to and from your account. The list includes paging.",
        "naïve café ÉcoleNormale x_y-z.w ABCdef 2x3y İstanbul ﬁle",
        "The the THE tHe a an",
        "",
        "x" * 100,
    ],
)
def test_terms_are_the_stemmed_words_of_split_identifier_less_stop_words(text: str) -> None:
    # `terms` looks words up run by run (a memo of alphanumeric runs); it must give what the
    # plain definition gives, whatever the text (and again, from the memo).
    plain = [stem(w) for w in split_identifier(text) if w not in STOP_WORDS]
    assert terms(text) == plain
    assert terms(text) == plain
