"""The fast accept of an input schema: jsonschema-rs (compiled, in Rust) says whether a value is
valid; only when it says no (or cannot take the schema) does `jsonschema` judge, and it stays the
one writer of a refusal's error (the failing path, its message), so replies are unchanged.

Built so that it never accepts what `jsonschema` (with RE2 patterns) refuses: patterns compile with
the linear-time `regex` engine (`RegexOptions`; a pattern it cannot take, such as a lookaround,
leaves the schema without a fast accept, to the bounded fallback of `schema_patterns`), formats are
checked, no reference is ever fetched, and a `$schema` outside drafts 4 to 2020-12 gets none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema_rs

Accept = Callable[[Any], bool]

_DRAFTS = frozenset(
    {
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "http://json-schema.org/draft-07/schema#",
        "http://json-schema.org/draft-07/schema",
        "http://json-schema.org/draft-06/schema#",
        "http://json-schema.org/draft-06/schema",
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-04/schema",
    }
)
_LINEAR = jsonschema_rs.RegexOptions()


def _never_fetch(uri: str) -> Any:
    raise LookupError(f"toolbus does not fetch schema references ({uri[:200]})")


def fast_accept(schema: Any) -> Accept | None:
    """A predicate that is True only for values `schema` accepts, or None when jsonschema-rs
    cannot take the schema under these rules (the caller then has `jsonschema` judge every value)."""
    if not isinstance(schema, dict):
        return None
    if "$schema" in schema and schema["$schema"] not in _DRAFTS:
        return None
    try:
        validator = jsonschema_rs.validator_for(
            schema,
            validate_formats=True,
            retriever=_never_fetch,
            pattern_options=_LINEAR,
        )
    except Exception:  # an invalid schema, a pattern the linear engine refuses, an unresolved $ref
        return None
    accept: Accept = validator.is_valid
    return accept
