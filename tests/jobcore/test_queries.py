"""`jobcore.queries`: every statement by one Noun_Verb name, and `queries.sql` holding what
they compile to, so a change's SQL reads as a diff."""

from __future__ import annotations

import re

from jobcore import queries
from jobcore.queries import listing


def test_queries_sql_is_what_the_statements_compile_to():
    assert listing.PATH.read_text() == listing.text(), (
        "shared/jobcore/queries/queries.sql is stale: run python -m jobcore.queries"
    )


def test_every_statement_is_named_noun_verb_and_listed_once():
    names = list(queries.named())
    assert len(names) == len(set(names))
    for name in names:
        noun = r"(job|history|lead|queue|table|notification)"
        assert re.fullmatch(noun + r"_[a-z]+(_[a-z]+)*", name), name
    # Every construct appears under one name only.
    constructs = [id(statement) for statement in queries.named().values()]
    assert len(constructs) == len(set(constructs))
