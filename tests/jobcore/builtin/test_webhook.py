"""The webhook handler against a real HTTP server on 127.0.0.1: what is sent, what is refused."""

from __future__ import annotations

import ipaddress
import socket

import httpcore
import pytest

from jobcore import PermanentError
from jobcore.builtin import webhook as webhook_module
from jobcore.builtin.webhook import webhook
from jobcore.builtin.webhook_policy import is_forbidden
from jobcore.ids import new_id
from jobcore.registry import JobContext
from tests.procs import free_port


def context(allow_private: bool = False) -> JobContext:
    return JobContext(new_id(), "webhook", 1, 5, webhook_allow_private=allow_private)


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, int]]:
    """Every connection the handler opens; opened for real only to loopback."""
    connections: list[tuple[str, int]] = []
    real_connect = httpcore.AnyIOBackend.connect_tcp

    async def spy(self, host, port, **kwargs):
        connections.append((host, port))
        # Should the policy regress, the test fails without connecting anywhere off this host.
        assert ipaddress.ip_address(host).is_loopback, f"would connect to {host}"
        return await real_connect(self, host, port, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", spy)
    return connections


def fake_dns(monkeypatch, *answers: list[str]) -> list[str]:
    """Replace the resolver: the n-th lookup gets answers[n] (the last one repeats)."""
    lookups: list[str] = []

    async def resolve(host, port):
        lookups.append(host)
        answer = answers[min(len(lookups), len(answers)) - 1]
        return [ipaddress.ip_address(a) for a in answer]

    monkeypatch.setattr(webhook_module, "resolve", resolve)
    return lookups


async def assert_retryable(payload, ctx) -> Exception:
    with pytest.raises(Exception) as info:
        await webhook(payload, ctx)
    assert not isinstance(info.value, PermanentError), info.value
    return info.value


# -- SSRF: refused permanently, nothing sent ---------------------------------------------

SSRF_HOSTS = {
    "IPv4 loopback": "127.0.0.1",
    "10/8": "10.0.0.1",
    "172.16/12": "172.16.0.1",
    "192.168/16": "192.168.0.1",
    "metadata 169.254.169.254": "169.254.169.254",
    "shared 100.64/10": "100.64.0.1",
    "multicast": "224.0.0.1",
    "unspecified 0.0.0.0": "0.0.0.0",
    "240/4 reserved": "240.0.0.1",
    "broadcast": "255.255.255.255",
    "IPv6 loopback": "[::1]",
    "IPv6 unspecified": "[::]",
    "fe80::/10": "[fe80::1]",
    "fc00::/7": "[fc00::1]",
    "ff00::/8": "[ff02::1]",
    "mapped loopback": "[::ffff:127.0.0.1]",
    "mapped private": "[::ffff:10.0.0.1]",
    "NAT64 loopback": "[64:ff9b::7f00:1]",
    "6to4 loopback": "[2002:7f00:1::1]",
    "6to4 private": "[2002:0a00:0001::]",
    "NAT64 private": "[64:ff9b::10.0.0.1]",
    "site-local fec0::/10": "[fec0::1]",
    "documentation 3fff::/20": "[3fff::1]",
    "documentation 2001:db8::/32": "[2001:db8::1]",
    "IETF 192.0.0/24": "192.0.0.1",
    "benchmarking 198.18/15": "198.18.0.1",
    "decimal private": "167772161",
    "octal private": "01200000001",
    "hex private": "0xa000001",
    "decimal": "2130706433",
    "hex": "0x7f000001",
    "dotted hex": "0x7f.0.0.1",
    "octal": "017700000001",
    "short": "127.1",
    "localhost": "localhost",
    "localhost subdomain": "api.localhost",
}


@pytest.mark.parametrize("host", SSRF_HOSTS.values(), ids=SSRF_HOSTS.keys())
async def test_non_public_destination_is_refused_permanently_with_nothing_sent(
    host, recorder, sent
):
    with pytest.raises(PermanentError, match="refusing"):
        await webhook({"url": recorder.url(host=host), "body": {}}, context())
    assert sent == []
    assert recorder.requests == []


async def test_name_resolving_to_loopback_is_refused_with_nothing_sent(
    monkeypatch, recorder, sent, caplog
):
    lookups = fake_dns(monkeypatch, ["127.0.0.1"])
    with pytest.raises(PermanentError, match="not a public address") as info:
        await webhook({"url": recorder.url(host="hooks.example")}, context())
    assert lookups == ["hooks.example"]
    assert sent == [] and recorder.requests == []
    assert "hooks.example" in str(info.value)
    assert "127.0.0.1" not in str(info.value)  # last_error is readable by every API client
    (line,) = [r for r in caplog.records if r.name == "jobqueue.webhook"]
    assert line.addresses == ["127.0.0.1"] and line.host == "hooks.example"


async def test_name_is_refused_if_any_of_its_addresses_is_not_public(
    monkeypatch, recorder, sent, caplog
):
    fake_dns(monkeypatch, ["8.8.8.8", "10.1.2.3", "fd00::7"])
    with pytest.raises(PermanentError, match="not a public address") as info:
        await webhook({"url": recorder.url(host="hooks.example")}, context())
    assert sent == [] and recorder.requests == []
    for address in ("8.8.8.8", "10.1.2.3", "fd00::7", "fd00"):
        assert address not in str(info.value)
    (line,) = [r for r in caplog.records if r.name == "jobqueue.webhook"]
    assert line.addresses == ["10.1.2.3", "fd00::7"]


async def test_name_the_system_resolver_maps_to_a_private_address_is_refused(
    recorder, sent, caplog
):
    # This machine's own name: /etc/hosts (or DNS) maps it to one of its addresses.
    name = socket.gethostname()
    addresses = {info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    if not all(is_forbidden(ipaddress.ip_address(a.partition("%")[0])) for a in addresses):
        pytest.skip(f"{name} resolves to a public address here")
    with pytest.raises(PermanentError, match="not a public address") as info:
        await webhook({"url": recorder.url(host=name)}, context())
    assert not any(address in str(info.value) for address in addresses)
    assert sent == [] and recorder.requests == []
    (line,) = [r for r in caplog.records if r.name == "jobqueue.webhook"]
    assert set(line.addresses) == addresses


async def test_request_goes_to_the_checked_address_not_a_second_lookup(monkeypatch, recorder):
    # DNS rebinding: a public answer for the check, loopback for anyone asking again.
    lookups = fake_dns(monkeypatch, ["93.184.216.34"], ["127.0.0.1"])
    connected: list[tuple[str, int]] = []
    real_connect = httpcore.AnyIOBackend.connect_tcp

    async def internet(self, host, port, **kwargs):
        # Stands in for the network: what was meant for the public address reaches the recorder.
        connected.append((host, port))
        return await real_connect(self, "127.0.0.1", recorder.port, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", internet)
    await webhook({"url": f"http://hooks.example:{recorder.port}/hook", "body": {}}, context())

    assert lookups == ["hooks.example"]
    assert connected == [("93.184.216.34", recorder.port)]
    (received,) = recorder.requests
    assert received.headers["host"] == f"hooks.example:{recorder.port}"


async def test_next_checked_address_is_tried_when_one_refuses_the_connection(
    monkeypatch, recorder, sent
):
    # The recorder listens on 127.0.0.1 only: 127.0.0.2 refuses.
    fake_dns(monkeypatch, ["127.0.0.2", "127.0.0.1"])
    await webhook({"url": recorder.url(host="hooks.example"), "body": {}}, context(True))
    assert sent == [("127.0.0.2", recorder.port), ("127.0.0.1", recorder.port)]
    assert len(recorder.requests) == 1


async def test_allowed_name_is_delivered_to_its_resolved_address_with_its_own_host_header(
    monkeypatch, recorder
):
    fake_dns(monkeypatch, ["127.0.0.1"], ["192.0.2.1"])
    await webhook({"url": recorder.url(host="hooks.example"), "body": 1}, context(True))
    (received,) = recorder.requests
    assert received.headers["host"] == f"hooks.example:{recorder.port}"


async def test_https_verifies_the_certificate_against_the_original_name(monkeypatch, tls_recorder):
    fake_dns(monkeypatch, ["127.0.0.1"])
    url = tls_recorder.url(host="hooks.example", scheme="https")
    error = await assert_retryable({"url": url, "body": {}}, context(True))
    assert "CERTIFICATE_VERIFY_FAILED" in str(error)  # self-signed: TLS is verified
    assert tls_recorder.server_names == ["hooks.example"]
    assert tls_recorder.requests == []


# -- delivery and outcomes (WEBHOOK_ALLOW_PRIVATE=true) -----------------------------------


async def test_delivery_is_one_json_post_carrying_the_job_id_as_idempotency_key(recorder):
    ctx = context(True)
    body = {"event": "paid", "amount": 12.5, "items": [1, "two", None]}
    payload = {"url": recorder.url("/hook?x=1"), "body": body, "headers": {"X-Signature": "s1"}}
    await webhook(payload, ctx)
    (received,) = recorder.requests
    assert received.method == "POST" and received.path == "/hook?x=1"
    assert received.json() == body
    assert received.headers["content-type"] == "application/json"
    assert received.headers["idempotency-key"] == str(ctx.job_id)
    assert received.headers["x-signature"] == "s1"
    assert received.headers["host"] == f"127.0.0.1:{recorder.port}"


async def test_missing_body_is_sent_as_json_null(recorder):
    await webhook({"url": recorder.url()}, context(True))
    (received,) = recorder.requests
    assert received.json() is None


async def test_localhost_is_resolved_and_delivered_when_private_destinations_are_allowed(
    recorder,
):
    # /etc/hosts may list ::1 first; the server listens on 127.0.0.1 only.
    await webhook({"url": recorder.url(host="localhost"), "body": {}}, context(True))
    assert len(recorder.requests) == 1


@pytest.mark.parametrize("status", [500, 502, 503, 429])
async def test_server_errors_and_429_are_retryable(status, recorder):
    error = await assert_retryable({"url": recorder.url(f"/status/{status}")}, context(True))
    assert str(status) in str(error)
    assert len(recorder.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
async def test_other_client_errors_are_permanent(status, recorder):
    with pytest.raises(PermanentError, match=str(status)):
        await webhook({"url": recorder.url(f"/status/{status}")}, context(True))
    assert len(recorder.requests) == 1


@pytest.mark.parametrize("status", [201, 202, 204])
async def test_any_2xx_is_success(status, recorder):
    await webhook({"url": recorder.url(f"/status/{status}")}, context(True))
    assert len(recorder.requests) == 1


async def test_redirect_is_permanent_and_never_followed(recorder):
    with pytest.raises(PermanentError, match="302"):
        await webhook({"url": recorder.url("/redirect"), "body": {}}, context(True))
    assert [r.path for r in recorder.requests] == ["/redirect"]


@pytest.mark.parametrize("status", [301, 303, 307, 308])
async def test_every_3xx_is_permanent(status, recorder):
    with pytest.raises(PermanentError, match=str(status)):
        await webhook({"url": recorder.url(f"/status/{status}")}, context(True))


async def test_connection_refused_is_retryable():
    url = f"http://127.0.0.1:{free_port()}/hook"
    error = await assert_retryable({"url": url, "body": {}}, context(True))
    assert "connect" in str(error).lower()


async def test_timeout_is_retryable(monkeypatch, recorder):
    monkeypatch.setattr(webhook_module, "TIMEOUT", 0.5)
    error = await assert_retryable({"url": recorder.url("/slow")}, context(True))
    assert "Timeout" in str(error)


async def test_unresolvable_name_is_retryable(monkeypatch):
    async def fail(host, port):
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(webhook_module, "resolve", fail)
    error = await assert_retryable({"url": "https://hooks.example/"}, context())
    assert "resolve" in str(error)


# -- invalid payloads: permanent, nothing sent --------------------------------------------

INVALID = {
    "not an object": ["https://example.com"],
    "null": None,
    "missing url": {"body": {}},
    "url not a string": {"url": 42},
    "empty url": {"url": " "},
    "unknown field": {"url": "https://example.com/", "header": {}},
    "ftp scheme": {"url": "ftp://example.com/"},
    "file scheme": {"url": "file:///etc/passwd"},
    "no scheme": {"url": "example.com/hook"},
    "no host": {"url": "http:///hook"},
    "malformed IPv6": {"url": "http://[::1/hook"},
    "numeric host out of range": {"url": "http://256.256.256.256/"},
    "port 0": {"url": "http://example.com:0/"},
    "port out of range": {"url": "http://example.com:65536/"},
    "headers not an object": {"url": "https://example.com/", "headers": ["X-A: b"]},
    "header value not a string": {"url": "https://example.com/", "headers": {"X-A": 1}},
    "header value with CRLF": {"url": "https://example.com/", "headers": {"X-A": "a\r\nB: c"}},
    "header name with space": {"url": "https://example.com/", "headers": {"X A": "b"}},
    "Host header": {"url": "https://example.com/", "headers": {"Host": "internal"}},
    "Content-Length header": {"url": "https://example.com/", "headers": {"content-length": "0"}},
    "Transfer-Encoding header": {
        "url": "https://example.com/",
        "headers": {"Transfer-Encoding": "chunked"},
    },
    "Idempotency-Key header": {"url": "https://example.com/", "headers": {"Idempotency-Key": "x"}},
}


@pytest.mark.parametrize("payload", INVALID.values(), ids=INVALID.keys())
async def test_invalid_payload_is_permanent_with_nothing_sent(payload, monkeypatch, sent):
    lookups = fake_dns(monkeypatch, ["8.8.8.8"])
    with pytest.raises(PermanentError):
        await webhook(payload, context(True))
    assert sent == [] and lookups == []
