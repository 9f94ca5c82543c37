"""Targets: one spelling per target, so no spelling of a URL gets a bucket of its own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayito_constructs.egress import TargetError, canonical_host, declared_target, normalize, origin
from rayito_constructs.egress.targets import (
    MAX_CLASS_VALUES,
    declared,
    from_parts,
    parse,
    path_segments,
    redact,
    redacted_error,
    remove_dot_segments,
    resolve,
    route,
)

API = "https://api.example.com"


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("https://API.example.com:443/a?b=1", API),
        ("https://api.example.com/c", API),
        ("api.example.com", API),
        ("//api.example.com/x", API),
        ("HTTP://Example.COM:80/x", "http://example.com"),
        ("http://example.com:8080/x", "http://example.com:8080"),
        ("https://example.com:0443", "https://example.com"),
        ("https://example.com:80", "https://example.com:80"),
        ("https://bücher.de/buch", "https://xn--bcher-kva.de"),
        ("https://XN--BCHER-KVA.de/", "https://xn--bcher-kva.de"),
        # IDNA 2008 with UTS #46, not IDNA 2003: ß and ς are kept, not mapped to ss and σ.
        ("https://straße.de", "https://xn--strae-oqa.de"),
        ("https://ＡＰＩ。example.com", API),  # full-width letters and dot are mapped
        ("https://%61pi.example.com", API),
        ("https://EXAMPLE.com./", "https://example.com"),
        ("https://user:pw@example.com/x", "https://example.com"),
        ("https://my_host.example.com", "https://my_host.example.com"),
        ("https://[::1]:8443/x", "https://[::1]:8443"),
        ("http://[0:0:0:0:0:0:0:1]/", "http://[::1]"),
        ("http://[0000:0000::0001]/", "http://[::1]"),
        ("http://[2001:DB8:0:0:0:0:0:1]/", "http://[2001:db8::1]"),
        ("http://[::ffff:127.0.0.1]/", "http://127.0.0.1"),
        ("http://[::ffff:7f00:1]/", "http://127.0.0.1"),
        ("http://2130706433/", "http://127.0.0.1"),
        ("http://0x7f000001/", "http://127.0.0.1"),
        ("http://0x7f.1/", "http://127.0.0.1"),
        ("http://0177.0.0.1/", "http://127.0.0.1"),
        ("http://127.1/", "http://127.0.0.1"),
        ("http://127.0.0.1./", "http://127.0.0.1"),
        ("http://１２７.0.0.1/", "http://127.0.0.1"),  # full-width digits
        ("wss://stream.example.com:443/socket", "wss://stream.example.com"),
        ("https://api.example.com\\v1", API),
    ],
)
def test_one_spelling_per_target(url, target) -> None:
    assert normalize(url) == target


@pytest.mark.parametrize(
    "url",
    [
        "", "   ", "https://", "https://:443/", "ftp://example.com", "javascript:alert(1)", "https://exa mple.com",
        "https://example.com\n.evil.org", "http://[::1/", "http://[::g]/", "http://::1/", "http://1.2.3.4.5/",
        "http://256.0.0.1/", "http://0x100000000/", "http://08.0.0.1/", "http://1..2/", "https://a..b.com",
        "https://example.com:99999", "https://example.com:-1", "https://example.com:x", "https://%ff.com",
        "https://exa%2Fmple.com", "https://" + "a" * 64 + ".com", "https://" + ".".join(["a" * 60] * 5),
        "https://\u0000.com", "https://xn--a.com\u200b", "https://[::1]x/", "https://a\u3000b.com",
    ],
)
def test_hostile_targets_are_refused(url) -> None:
    with pytest.raises(TargetError):
        normalize(url)


def test_non_strings_are_refused() -> None:
    with pytest.raises(TargetError):
        parse(None)  # type: ignore[arg-type]


def test_ipv6_zone_is_kept() -> None:
    assert origin("http://[fe80::1%25eth0]:8080/") == "http://[fe80::1%eth0]:8080"
    assert canonical_host("[FE80:0::1]") == "[fe80::1]"


def test_parts_from_an_http_client_are_normalized_too() -> None:
    assert from_parts("HTTP", "::1", 80, "/a/../b", "").origin == "http://[::1]"
    assert from_parts("https", "API.example.com", None, "", "").origin == API
    with pytest.raises(TargetError):
        from_parts("gopher", "example.com", None, "/", "")
    with pytest.raises(TargetError):
        from_parts("https", "example.com", 70000, "/", "")


def test_remove_dot_segments_is_rfc_3986() -> None:
    # RFC 3986 section 5.2.4 examples.
    assert remove_dot_segments("/a/b/c/./../../g") == "/a/g"
    assert remove_dot_segments("mid/content=5/../6") == "mid/6"
    assert remove_dot_segments("/../a") == "/a"
    assert remove_dot_segments("../a") == "a"
    assert remove_dot_segments("/a/..") == "/"
    assert remove_dot_segments("/a/.") == "/a/"
    assert remove_dot_segments(".") == ""
    assert remove_dot_segments("/..") == "/" and remove_dot_segments("/../../a") == "/a"


def test_paths_that_dodge_a_class_fall_under_it() -> None:
    declared_targets = [declared_target(f"{API}/v1/search")]
    for url in [f"{API}/v1/search", f"{API}/v1/x/../search", f"{API}/v1/%73earch", f"{API}//v1/search",
                f"{API}/v1/./search/", f"{API}/V1/Search", f"{API}/v1/search;jsessionid=1", f"{API}/v1%2Fsearch",
                f"{API}/v1%2fsearch/more", f"{API}/v1\\search", f"{API}/%2E%2E/v1/search", f"{API}/v1/%2e/search",
                f"{API}/v1/search?x=1#frag",
                # ;parameters go before dot segments are removed, as Tomcat, Jetty and Spring read
                # a path (the `..;` bypass), percent-encoded dots too:
                f"{API}/v1/x/..;/search", f"{API}/v1/x/%2e%2e;/search", f"{API}/v1/x/.%2E;a=b/search",
                f"{API}/a/..;/../v1/search", f"{API}/v1;x=1/search;y", f"{API}/;/v1/./;/search",
                f"{API}/v1/x/..;/..;/v1/search"]:
        assert normalize(url, declared_targets) == f"{API}/v1/search", url
    assert parse(f"{API}/v1/x/..;/search").path == "/v1/search"
    for url in [f"{API}/v1/searching", f"{API}/v1/search%20", f"{API}/v2/search", f"{API}/v1", f"{API}/",
                f"{API}/v1/search/..;/x", f"{API}/v1/search;/../x"]:
        assert normalize(url, declared_targets) == API, url
    assert path_segments("/a/%7Euser/%41") == ("a", "~user", "a")


def test_path_and_query_classes() -> None:
    declared_targets = [declared_target("https://api.example.com/v1/chat/"), declared_target(f"{API}/v1/chat?model")]
    assert declared_targets == [f"{API}/v1/chat", f"{API}/v1/chat?model"]
    assert normalize(f"{API}/v1/chat/completions?model=big&x=1", declared_targets) == f"{API}/v1/chat?model=big"
    assert normalize(f"{API}/v1/chat/completions?x=1;model=Big", declared_targets) == f"{API}/v1/chat?model=big"
    assert normalize(f"{API}/v1/chat?%6Dodel=big", declared_targets) == f"{API}/v1/chat?model=big"
    assert normalize(f"{API}/v1/chat?stream=1", declared_targets) == f"{API}/v1/chat"
    assert normalize(f"{API}/v1/chatter", declared_targets) == API  # a prefix is a path segment, not characters
    assert normalize("https://API.example.com:443/v2", declared_targets) == API


def test_a_request_pays_every_class_it_falls_under_and_its_origin_when_the_origin_has_an_envelope() -> None:
    decl = [declared(f"{API}/v1"), declared(f"{API}/v1/search?region"), declared("https://other.org/v1")]
    assert [b.target for b in resolve(f"{API}/v1/search?region=eu", decl, own_origin=[API])] == [
        f"{API}/v1/search?region=eu", f"{API}/v1", API]
    assert [b.target for b in resolve(f"{API}/v1/search?region=eu", decl)] == [f"{API}/v1/search?region=eu", f"{API}/v1"]
    # Several values of the class: each of their buckets pays (the server may read any of them).
    assert [b.target for b in resolve(f"{API}/v1/search?region=us&region=eu&region=EU", decl)] == [
        f"{API}/v1/search?region=eu", f"{API}/v1/search?region=us", f"{API}/v1"]
    many = "&".join(f"region={i}" for i in range(MAX_CLASS_VALUES + 1))
    with pytest.raises(TargetError, match="at most"):
        resolve(f"{API}/v1/search?{many}", decl)
    # A huge or strange value is kept as a hash, a key DynamoDB takes.
    (bucket, _) = resolve(f"{API}/v1/search?region=" + "x" * 5000, decl)
    assert bucket.value.startswith("sha256:") and len(bucket.target) < 200
    assert [b.target for b in route(parse("https://unrelated.org/v1"), decl, charge_origin=False)] == ["https://unrelated.org"]


@pytest.mark.parametrize(
    ("target", "problem"),
    [(f"{API}/v1?a=1", "one parameter name"), (f"{API}/v1?a&b", "one parameter name"), (f"{API}/v1?", "no name"),
     (f"{API}/v1#x", "fragment"), ("ftp://x.org", "scheme")],
)
def test_declared_targets_are_checked(target, problem) -> None:
    with pytest.raises(TargetError, match=problem):
        declared_target(target)


HOST = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){1,3}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(host=HOST, port=st.sampled_from([None, 443, 8443]), path=st.lists(st.sampled_from(["a", "B", ".", "..", "", "%41", "x;y"]), max_size=6),
       upper=st.booleans())
def test_normalization_is_idempotent_and_spelling_blind(host, port, path, upper) -> None:
    url = f"https://{host.upper() if upper else host}{'' if port is None else f':{port}'}/{'/'.join(path)}"
    target = normalize(url)
    assert normalize(target) == target
    assert target == normalize(f"https://{host}{'' if port in (None, 443) else f':{port}'}/")


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_spelling_of_an_ipv4_address_is_one_target(value) -> None:
    dotted = ".".join(str((value >> s) & 255) for s in (24, 16, 8, 0))
    expected = f"http://{dotted}"
    assert normalize(f"http://{value}/") == expected
    assert normalize(f"http://{hex(value)}/") == expected
    assert normalize(f"http://[::ffff:{dotted}]/") == expected
    a, b = value >> 24, value & 0xFFFFFF
    assert normalize(f"http://{a}.{b}/") == expected
    assert normalize(f"http://0{oct(a)[2:]}.{b}/") == expected


def test_corners_of_hosts_paths_and_queries() -> None:
    assert canonical_host("::1") == "[::1]"  # an unbracketed address handed over by a client
    for host in ("[::g]", "[1:2:3:4:5:6:7:8:9]"):
        with pytest.raises(TargetError):
            canonical_host(host)
    with pytest.raises(TargetError, match="part 'a'"):
        normalize("http://1.a.3.4/")
    assert remove_dot_segments("./a/b") == "a/b"
    with pytest.raises(TargetError, match="no name"):
        declared_target(f"{API}/v1?%20")
    decl = [declared(f"{API}/v1?model"), declared(f"{API}/v1?region")]
    assert [b.target for b in resolve(f"{API}/v1/x?model=a&&region=b", decl)] == [f"{API}/v1?model=a", f"{API}/v1?region=b"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://bot:hunter2@api.example.com:99999/v1/items/0?api_key=sk-live-0&flag&a=1;b=2#token",
         "https://***@api.example.com:99999/v1/items/0?api_key=***&***&a=***;b=***#***"),
        ("bot:pw@api.example.com:99999/x", "***@api.example.com:99999/x"),  # no scheme
        ("https://bot:p/w@api.example.com/x", "https://***@api.example.com/x"),  # a '/' in the password
        ("https:\\\\u:p@h/x", "https:\\\\***@h/x"),
        ("https://api.example.com:99999/a?", "https://api.example.com:99999/a?"),
        ("https://h/a\nb", "https://h/a\\x0ab"),
        (None, "<NoneType>"),
        (b"https://u:p@h", "<bytes>"),
        ("https://h/" + "a" * 500, ("https://h/" + "a" * 500)[:256]),
    ],
)
def test_a_url_that_is_not_a_target_is_logged_redacted(url, shown) -> None:
    assert redact(url) == shown


def test_a_target_errors_message_quotes_the_url_redacted() -> None:
    url = "https://bot:hunter2@api.example.com:99999/x?api_key=sk-live"
    with pytest.raises(TargetError) as info:
        parse(url)
    assert "hunter2" in str(info.value)  # the message quotes the URL as given...
    message = redacted_error(info.value, url)
    assert "hunter2" not in message and "sk-live" not in message  # ...the redacted one does not
    assert message.startswith("'https://***@api.example.com:99999/x?api_key=***'")

