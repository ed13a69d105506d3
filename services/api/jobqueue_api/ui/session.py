"""The dashboard's sign-in session and CSRF tokens: what its cookies hold and how they are
checked. Pure functions of their inputs (the configured tokens, the cookies, the time).

Session: with API_TOKENS set, signing in with one of the tokens sets the cookie
`jobqueue_session` = `<expiry>.<HMAC-SHA256 keyed by the token over the expiry>`. It is
checked against every configured token in constant time, so the cookie never holds a token,
any API process (or replica) accepts a session another one made, a session ends at its
expiry, and removing a token from API_TOKENS ends the sessions signed in with it.

CSRF: every form that acts carries `csrf_token`, an HMAC keyed by a secret the browser
holds in an HttpOnly cookie and no other site can read or choose: the session when signed
in, else `jobqueue_csrf` (random, set on the first page). A request whose form token does
not match is refused before anything is done.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence

from jobqueue_api.middleware import token_matches

SESSION_COOKIE = "jobqueue_session"
CSRF_COOKIE = "jobqueue_csrf"
CSRF_FIELD = "csrf_token"
# How long a sign-in lasts; the browser drops the cookie then too.
SESSION_SECONDS = 12 * 3600

_SESSION_LABEL = b"jobqueue-ui-session\x00"
_CSRF_LABEL = b"jobqueue-ui-csrf"


def _signature(token: bytes, expires: int) -> str:
    return hmac.new(token, _SESSION_LABEL + str(expires).encode(), hashlib.sha256).hexdigest()


def new_session(token: str, now: float) -> str:
    """The session cookie's value for a sign-in with `token` (one of API_TOKENS) at `now`."""
    expires = int(now) + SESSION_SECONDS
    return f"{expires}.{_signature(token.encode('utf-8'), expires)}"


def valid_session(value: str | None, tokens: Sequence[str], now: float) -> bool:
    """Whether `value` is a session made with one of `tokens` that has not expired."""
    if not value or not tokens:
        return False
    expires_text, _, presented = value.partition(".")
    if not (expires_text.isascii() and expires_text.isdigit()) or len(expires_text) > 12:
        return False
    expires = int(expires_text)
    if not now < expires <= now + SESSION_SECONDS:
        return False
    expected = [_signature(token.encode("utf-8"), expires).encode() for token in tokens]
    return token_matches(presented.encode("utf-8", "replace"), expected)


def signed_in(token: str, tokens: Sequence[str]) -> bool:
    """Whether the token typed into the sign-in form is one of API_TOKENS."""
    encoded = [t.encode("utf-8") for t in tokens]
    return bool(token) and token_matches(token.encode("utf-8", "replace"), encoded)


def new_csrf_secret() -> str:
    return secrets.token_urlsafe(32)


def csrf_token(secret: str) -> str:
    """The token forms carry, derived from the browser's secret cookie."""
    return hmac.new(secret.encode("utf-8"), _CSRF_LABEL, hashlib.sha256).hexdigest()


def csrf_matches(presented: str | None, secret: str | None) -> bool:
    if not presented or not secret:
        return False
    return hmac.compare_digest(presented.encode("utf-8", "replace"), csrf_token(secret).encode())
