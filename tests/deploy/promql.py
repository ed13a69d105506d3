"""Just enough PromQL reading for the tests of the dashboard and the alert rules: which metrics
an expression selects, and which aggregation encloses each selection.

Not a parser: a tokenizer that knows what cannot be a metric name (strings, durations,
numbers, Grafana variables, label names inside `{}` and in `by (...)`-like lists, functions,
keywords) and a walk outwards from a selector over the parentheses around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<variable>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?:[a-zA-Z]+\d*)*)
  | (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<space>\s+)
  | (?P<symbol>[^\s])
    """,
    re.VERBOSE,
)

# Followed by a parenthesised list of label names (or, for the group modifiers, alone).
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = LABEL_LISTS | {"bool", "offset", "and", "or", "unless", "atan2"}
NUMBERS = frozenset({"inf", "nan"})
AGGREGATIONS = frozenset(
    {
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Token:
    kind: str
    text: str


def tokens(expr: str) -> list[Token]:
    """The expression's tokens, whitespace left out."""
    found = []
    for match in _TOKEN.finditer(expr):
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            found.append(Token(kind, match.group()))
    return found


def _selectors(toks: list[Token]) -> list[int]:
    """Indexes of the tokens that name a metric."""
    if any(t.kind == "name" and t.text == "__name__" for t in toks):
        raise ValueError("selectors by __name__ are not supported")
    found = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.text in ("{", "["):  # label matchers, ranges and subqueries: no metric inside
            i = _closing(toks, i)
        elif tok.kind == "name" and tok.text in LABEL_LISTS:
            if i + 1 < len(toks) and toks[i + 1].text == "(":
                i = _closing(toks, i + 1)
        elif tok.kind == "name" and tok.text not in KEYWORDS and tok.text.lower() not in NUMBERS:
            following = toks[i + 1].text if i + 1 < len(toks) else ""
            # A call, or an aggregation with its label list first: `sum by (queue) (...)`.
            is_call = following in ("(", "by", "without")
            if not is_call:
                found.append(i)
        i += 1
    return found


def _closing(toks: list[Token], start: int) -> int:
    """Index of the bracket closing the one at `start`."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    opening = toks[start].text
    depth = 0
    for i in range(start, len(toks)):
        if toks[i].text == opening:
            depth += 1
        elif toks[i].text == pairs[opening]:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced {opening!r}")


def _opening(toks: list[Token], end: int) -> int:
    """Index of the `(` that the `)` at `end` closes."""
    depth = 0
    for i in range(end, -1, -1):
        if toks[i].text == ")":
            depth += 1
        elif toks[i].text == "(":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced ')'")


def metric_names(expr: str) -> set[str]:
    """Every metric name the expression selects."""
    toks = tokens(expr)
    return {toks[i].text for i in _selectors(toks)}


def enclosing_calls(expr: str, metric: str) -> list[list[str]]:
    """For each selection of `metric`, the functions and aggregations around it, innermost
    first (`max by (queue) (rate(x[5m]))` gives `[["rate", "max"]]` for x)."""
    toks = tokens(expr)
    found = []
    for index in _selectors(toks):
        if toks[index].text == metric:
            found.append(_calls_around(toks, index))
    return found


def _calls_around(toks: list[Token], index: int) -> list[str]:
    calls = []
    i = index
    while True:
        # Outwards to the nearest unclosed "(".
        depth = 0
        i -= 1
        while i >= 0:
            if toks[i].text == ")":
                depth += 1
            elif toks[i].text == "(":
                if depth == 0:
                    break
                depth -= 1
            i -= 1
        if i < 0:
            return calls
        before = i - 1
        # `max by (queue) (...)`: the label list sits between the aggregation and its "(".
        if before >= 0 and toks[before].text == ")":
            start = _opening(toks, before)
            if start >= 1 and toks[start - 1].text in LABEL_LISTS:
                before = start - 2
        if before >= 0 and toks[before].kind == "name" and toks[before].text not in KEYWORDS:
            calls.append(toks[before].text)


def innermost_aggregation(calls: list[str]) -> str | None:
    return next((c for c in calls if c in AGGREGATIONS), None)
