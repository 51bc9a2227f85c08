"""The Porter stemmer (M. F. Porter, 1980, "An algorithm for suffix stripping"), from Snowball's
C implementation (`PyStemmer`, its "porter" algorithm).

`stem("creating") == stem("create") == "creat"`: words that differ by an inflectional or
derivational suffix meet on one stem. Input is expected lowercase ASCII; other words, and words of
one or two letters (as in Porter's own C version: "is", "as", "us" stay whole), pass through.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import Stemmer

# A Snowball stemmer keeps state while it stems, so each thread has its own (the index is built
# in a worker thread while queries are stemmed on the event loop).
_local = threading.local()


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The Porter stem of a lowercase word; words of one or two letters are kept as they are."""
    if len(word) <= 2 or not word.isascii() or not word.isalpha():
        return word
    porter = getattr(_local, "porter", None)
    if porter is None:
        porter = _local.porter = Stemmer.Stemmer("porter", 0)
    result: str = porter.stemWord(word)
    return result
