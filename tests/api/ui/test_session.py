"""The session cookie and CSRF tokens, as pure functions: what they accept and refuse."""

from __future__ import annotations

import time

import pytest

from jobqueue_api.ui.session import (
    SESSION_SECONDS,
    csrf_matches,
    csrf_token,
    new_csrf_secret,
    new_session,
    signed_in,
    valid_session,
)

NOW = 1_800_000_000.0


def test_a_session_holds_no_token_and_is_valid_for_its_token_only():
    session = new_session("s3cret-token", NOW)
    assert "s3cret-token" not in session
    assert valid_session(session, ["other", "s3cret-token"], NOW)
    assert not valid_session(session, ["other"], NOW)
    assert not valid_session(session, [], NOW)


def test_a_session_ends_at_its_expiry_and_cannot_be_extended():
    session = new_session("t", NOW)
    assert valid_session(session, ["t"], NOW + SESSION_SECONDS - 1)
    assert not valid_session(session, ["t"], NOW + SESSION_SECONDS)
    expires, _, signature = session.partition(".")
    # A later expiry under the same signature does not verify.
    assert not valid_session(f"{int(expires) + 3600}.{signature}", ["t"], NOW)


@pytest.mark.parametrize(
    "forged",
    ["", ".", "abc", "123", "1800043200.", "x.y", "99999999999999.00", "1800043200.zz\u00e9"],
)
def test_a_malformed_session_is_refused(forged):
    assert not valid_session(forged, ["t"], NOW)


def test_an_expiry_beyond_a_sessions_lifetime_is_refused_even_if_signed():
    # Signed with the real key but claiming to last longer than a sign-in may.
    far = new_session("t", NOW + SESSION_SECONDS)
    assert not valid_session(far, ["t"], NOW)


def test_the_sign_in_form_accepts_exactly_the_configured_tokens():
    assert signed_in("b", ["a", "b"])
    assert not signed_in("", ["a", "b"])
    assert not signed_in("a ", ["a", "b"])
    assert not signed_in("c", ["a", "b"])
    assert not signed_in("é", ["a"])


def test_a_csrf_token_matches_only_its_own_secret():
    secret, other = new_csrf_secret(), new_csrf_secret()
    assert secret != other and len(secret) >= 40
    assert csrf_matches(csrf_token(secret), secret)
    assert not csrf_matches(csrf_token(other), secret)
    assert not csrf_matches("", secret)
    assert not csrf_matches(None, secret)
    assert not csrf_matches(csrf_token(secret), None)
    assert not csrf_matches(secret, secret)  # the secret itself is not the token


def test_sessions_made_now_are_valid_now():
    assert valid_session(new_session("t", time.time()), ["t"], time.time())
