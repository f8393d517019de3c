"""The server's guards on their own, without a model: the Host names it answers by default,
how a Host header is read, and accept errors told once a minute with a count rather than
once each (a server out of file descriptors wrote half a million of them in 40 s)."""

from __future__ import annotations

import asyncio
import logging

import pytest

pytest.importorskip("fastapi")

from ngramcache.serving.connections import ACCEPT_ERROR, quiet_accept_errors, raise_open_files_limit  # noqa: E402
from ngramcache.serving.guards import _host_name, default_allowed_hosts, is_loopback  # noqa: E402


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True),
                                           ("localhost", True), ("app.localhost", True), ("0.0.0.0", False),
                                           ("::", False), ("192.168.1.4", False), ("box.lan", False)])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_the_default_host_names():
    assert default_allowed_hosts("127.0.0.1") == ("127.0.0.1", "localhost", "::1")
    assert default_allowed_hosts("192.168.1.4") == ("192.168.1.4", "localhost", "127.0.0.1", "::1")
    assert default_allowed_hosts("[::1]") == ("::1", "localhost", "127.0.0.1")
    assert default_allowed_hosts("0.0.0.0") is None and default_allowed_hosts("::") is None


@pytest.mark.parametrize("header,name", [(b"localhost:8080", "localhost"), (b"LocalHost", "localhost"),
                                         (b"[::1]:8080", "::1"), (b"[::1]", "::1"), (b"127.0.0.1", "127.0.0.1"),
                                         (b"::1", "::1"), (b" box.lan:80 ", "box.lan")])
def test_the_name_of_a_host_header(header, name):
    assert _host_name(header) == name


def test_accept_errors_are_told_once_a_minute_with_a_count(caplog):
    log = logging.getLogger("test.accept")
    loop = asyncio.new_event_loop()
    other = []
    try:
        loop.set_exception_handler(lambda loop, context: other.append(context["message"]))
        quiet_accept_errors(loop, log, every=0.2)
        error = OSError(24, "Too many open files")
        with caplog.at_level(logging.ERROR, logger="test.accept"):
            for _ in range(10_000):
                loop.call_exception_handler({"message": ACCEPT_ERROR, "exception": error})
            assert len(caplog.records) == 1
            loop.run_until_complete(asyncio.sleep(0.25))
            loop.call_exception_handler({"message": ACCEPT_ERROR, "exception": error})
        loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
    said = "cannot accept connections: Too many open files (accept errors since the last report: {}; see serve " \
           "--max-connections)"
    assert [r.getMessage() for r in caplog.records] == [said.format(1), said.format(10000)]
    assert other == ["something else"]  # every other error goes where it went before


def test_the_open_files_limit_is_raised_to_fit():
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        want = soft + 10 if hard == resource.RLIM_INFINITY else min(hard, soft + 10)
        assert raise_open_files_limit(want) == want
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == want
        assert raise_open_files_limit(1) == want  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
