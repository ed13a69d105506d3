"""Signing in to the dashboard when API_TOKENS is set: the pages need a session, the
session cookie's attributes and contents, signing out, and what a session does not open."""

from __future__ import annotations

import time
from urllib.parse import quote

import httpx
import pytest

from jobqueue_api.state import state_of
from jobqueue_api.ui.session import SESSION_COOKIE, SESSION_SECONDS, new_session
from tests.api.conftest import app_of
from tests.api.ui.seed import add_jobs, altered, csrf_of

TOKEN = "s3cret-token-one"
OTHER = "another-token-two"


async def sign_in(api: httpx.AsyncClient, token: str = TOKEN, next: str = "") -> httpx.Response:
    form = (await api.get("/ui/sign-in")).text
    data = {"csrf_token": csrf_of(form), "token": token}
    if next:
        data["next"] = next
    return await api.post("/ui/sign-in", data=data)


def set_cookies(response: httpx.Response) -> dict[str, str]:
    """Set-Cookie headers by cookie name."""
    found = {}
    for header in response.headers.get_list("set-cookie"):
        found[header.split("=", 1)[0]] = header
    return found


@pytest.mark.parametrize(
    "path",
    [
        "/ui/",
        "/ui/jobs?queue=mail",
        "/ui/jobs/01a22fbe-9723-7ee7-be02-c4f63a9eacea",
        "/ui/dead-letters",
    ],
)
async def test_with_api_tokens_every_page_sends_the_browser_to_sign_in_first(make_api, path):
    api = await make_api(API_TOKENS=TOKEN)
    response = await api.get(path)
    assert response.status_code == 303
    assert response.headers["location"] == f"/ui/sign-in?next={quote(path, safe='')}"
    assert response.headers["x-frame-options"] == "DENY"
    # Nor does a bearer token open the pages: a browser sends none.
    with_bearer = await api.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert with_bearer.status_code == 303


async def test_the_sign_in_form_takes_the_token_in_a_password_field(make_api):
    api = await make_api(API_TOKENS=TOKEN)
    form = await api.get("/ui/sign-in")
    assert form.status_code == 200
    assert '<input id="token" name="token" type="password"' in form.text
    assert '<label for="token">Token</label>' in form.text
    # The static files stay open: the form is styled before signing in.
    assert (await api.get("/ui/static/dashboard.css")).status_code == 200


@pytest.mark.parametrize(
    "action",
    [
        "/ui/jobs/01a22fbe-9723-7ee7-be02-c4f63a9eacea/retry",
        "/ui/dead-letters/retry",
        "/ui/sign-out",
    ],
)
async def test_an_action_before_signing_in_is_refused_401(make_api, action):
    api = await make_api(API_TOKENS=TOKEN)
    [job_id] = await add_jobs(state_of(app_of(api)).engine, status="dead_letter")
    csrf = csrf_of((await api.get("/ui/sign-in")).text)
    response = await api.post(
        action.replace("01a22fbe-9723-7ee7-be02-c4f63a9eacea", str(job_id)),
        data={"csrf_token": csrf},
    )
    assert response.status_code == 401 and "Sign in first" in response.text
    status = await api.get(f"/jobs/{job_id}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status.json()["status"] == "dead_letter"


async def test_signing_in_sets_an_httponly_strict_cookie_for_ui_that_holds_no_token(make_api):
    api = await make_api(API_TOKENS=f"{OTHER},{TOKEN}")
    response = await sign_in(api)
    assert response.status_code == 303 and response.headers["location"] == "/ui/"
    cookie = set_cookies(response)[SESSION_COOKIE]
    attributes = [part.strip().lower() for part in cookie.split(";")]
    assert "httponly" in attributes
    assert "samesite=strict" in attributes
    assert "path=/ui" in attributes
    assert f"max-age={SESSION_SECONDS}" in attributes
    assert "secure" not in attributes  # plain http: a Secure cookie would never come back
    assert TOKEN not in cookie and OTHER not in cookie
    page = await api.get("/ui/")
    assert page.status_code == 200 and "<h1>Queues</h1>" in page.text
    assert "Sign out" in page.text


async def test_over_https_the_session_cookie_is_secure(make_api):
    api = await make_api(API_TOKENS=TOKEN)
    api.base_url = httpx.URL("https://api")
    cookie = set_cookies(await sign_in(api))[SESSION_COOKIE]
    assert "secure" in [part.strip().lower() for part in cookie.split(";")]


async def test_a_wrong_token_is_refused_401_and_sets_no_session(make_api):
    api = await make_api(API_TOKENS=TOKEN)
    for wrong in ("wrong", TOKEN + "x", TOKEN[:-1], ""):
        response = await sign_in(api, wrong)
        assert response.status_code in (400, 401)
        assert SESSION_COOKIE not in set_cookies(response)
    response = await sign_in(api, "wrong")
    assert "That token is not one of API_TOKENS." in response.text
    assert (await api.get("/ui/")).status_code == 303


async def test_signing_in_without_the_forms_csrf_token_is_refused_403(make_api):
    api = await make_api(API_TOKENS=TOKEN)
    response = await api.post("/ui/sign-in", data={"token": TOKEN})
    assert response.status_code == 403
    assert SESSION_COOKIE not in set_cookies(response)


async def test_signing_out_clears_the_session_and_the_pages_need_signing_in_again(make_api):
    api = await make_api(API_TOKENS=TOKEN)
    await sign_in(api)
    page = await api.get("/ui/jobs")
    assert page.status_code == 200
    # Without the page's token, signing out is refused like any action.
    assert (await api.post("/ui/sign-out", data={})).status_code == 403
    out = await api.post("/ui/sign-out", data={"csrf_token": csrf_of(page.text)})
    assert out.status_code == 303 and out.headers["location"] == "/ui/sign-in"
    cleared = set_cookies(out)[SESSION_COOKIE].lower()
    assert "max-age=0" in cleared and "path=/ui" in cleared
    assert SESSION_COOKIE not in api.cookies
    assert (await api.get("/ui/jobs")).status_code == 303


async def test_actions_after_signing_in_use_a_token_bound_to_the_session(make_api):
    api = await make_api(API_TOKENS=TOKEN)
    [job_id] = await add_jobs(state_of(app_of(api)).engine, status="dead_letter")
    before = csrf_of((await api.get("/ui/sign-in")).text)
    await sign_in(api)
    # The token a page showed before signing in does not act for the session.
    stale = await api.post(f"/ui/jobs/{job_id}/retry", data={"csrf_token": before})
    assert stale.status_code == 403
    csrf = csrf_of((await api.get(f"/ui/jobs/{job_id}")).text)
    assert csrf != before
    done = await api.post(f"/ui/jobs/{job_id}/retry", data={"csrf_token": csrf})
    assert done.status_code == 200
    job = await api.get(f"/jobs/{job_id}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert job.json()["status"] == "pending"


async def test_the_session_does_not_open_the_api(make_api):
    api = await make_api(API_TOKENS=TOKEN)
    await sign_in(api)
    assert (await api.get("/ui/")).status_code == 200
    # The cookie's Path is /ui, and the API wants a bearer token whatever cookie comes.
    session = api.cookies.get(SESSION_COOKIE, path="/ui")
    assert session
    listed = await api.get("/jobs", headers={"Cookie": f"{SESSION_COOKIE}={session}"})
    assert listed.status_code == 401


async def test_a_session_ends_when_its_token_leaves_api_tokens(make_api, database_url):
    before = await make_api(API_TOKENS=f"{TOKEN},{OTHER}")
    await sign_in(before, OTHER)
    session = before.cookies.get(SESSION_COOKIE, path="/ui")
    # Another process with the same tokens takes the session; one without that token does not.
    same = await make_api(API_TOKENS=f"{TOKEN},{OTHER}")
    rotated = await make_api(API_TOKENS=TOKEN)
    cookie = {"Cookie": f"{SESSION_COOKIE}={session}"}
    assert (await same.get("/ui/", headers=cookie)).status_code == 200
    assert (await rotated.get("/ui/", headers=cookie)).status_code == 303


@pytest.mark.parametrize(
    "forged",
    [
        "1.00",
        new_session(TOKEN, time.time() - SESSION_SECONDS - 1),  # expired
        new_session("not-a-configured-token", time.time()),
        altered(new_session(TOKEN, time.time())),
        TOKEN,
    ],
    ids=["garbage", "expired", "other-token", "altered", "the-raw-token"],
)
async def test_a_forged_or_expired_session_is_refused(make_api, forged):
    api = await make_api(API_TOKENS=TOKEN)
    response = await api.get("/ui/", headers={"Cookie": f"{SESSION_COOKIE}={forged}"})
    assert response.status_code == 303


@pytest.mark.parametrize(
    "wanted, landing",
    [
        ("/ui/jobs?queue=mail&status=failed", "/ui/jobs?queue=mail&status=failed"),
        ("https://evil.example/ui/", "/ui/"),
        ("//evil.example/ui/", "/ui/"),
        ("/ui//evil.example", "/ui/"),
        ("/ui/\\evil", "/ui/"),
        ("/metrics", "/ui/"),
        ("javascript:alert(1)", "/ui/"),
    ],
)
async def test_signing_in_returns_to_the_page_asked_for_and_never_off_the_dashboard(
    make_api, wanted, landing
):
    api = await make_api(API_TOKENS=TOKEN)
    response = await sign_in(api, next=wanted)
    assert response.status_code == 303 and response.headers["location"] == landing


async def test_without_api_tokens_the_pages_are_open_and_there_is_no_sign_in(api):
    assert (await api.get("/ui/")).status_code == 200
    assert "Sign out" not in (await api.get("/ui/")).text
    form = await api.get("/ui/sign-in")
    assert form.status_code == 303 and form.headers["location"] == "/ui/"


@pytest.mark.parametrize("value", ["\u00b2.x", "1\u00b2.x", "..", "9" * 40, "abc"])
async def test_a_malformed_session_cookie_is_no_session_and_no_error(make_api, value):
    api = await make_api(API_TOKENS=TOKEN)
    cookie = f"{SESSION_COOKIE}={value}".encode("latin-1")  # as a browser may send it
    response = await api.get("/ui/", headers=[(b"cookie", cookie)])
    assert response.status_code == 303 and response.headers["x-frame-options"] == "DENY"


async def test_any_method_on_the_dashboards_root_carries_the_security_headers(make_api):
    api = await make_api(API_TOKENS=TOKEN)
    for method in ("POST", "PUT", "DELETE"):
        response = await api.request(method, "/ui", follow_redirects=True)
        assert response.status_code in (401, 403, 405), (method, response.status_code)
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
