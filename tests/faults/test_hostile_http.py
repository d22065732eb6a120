"""Hostile HTTP input against a real gateway process: every refusal is a typed 4xx (JSON
``{error, message}``), never a 500, and changes nothing (I9, I3).

Property-based: schemathesis generates valid and invalid requests for every operation of
``/openapi.json``; hypothesis generates arbitrary JSON bodies, query values and path
segments. Deterministic: huge, deeply nested and wrongly typed payloads, NUL characters,
missing/expired/forged tokens, other users and other tenants.

There is no WhatsApp channel yet (no webhook, no signature check to attack); when one
lands, its not-owner and bad-signature cases belong here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import jwt
import pytest
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests import services
from tests.cluster import SECRET, Cluster, cluster
from tests.faults.conftest import Invariants, Profile
from tests.faults.strategies import edit_value, json_value, nasty_text, not_utf8_json

pytestmark = pytest.mark.timeout(300)

ERROR_STATUSES = {401, 403, 404, 405, 409, 410, 413, 422, 429}


def run(coro: Any) -> Any:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass
class Target:
    c: Cluster
    database_url: str
    card: dict[str, Any]
    thread_id: str
    run_id: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.c.gateways[0].url

    def auth(self, user: str = "alice", tenant: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.c.tokens.issue(user, tenant or self.c.tenant)}"}

    def snapshot(self) -> dict[str, Any]:
        async def take() -> dict[str, Any]:
            db = await asyncpg.connect(self.database_url)
            try:
                out: dict[str, Any] = {}
                for table in ("cards", "runs", "threads"):
                    out[table] = await db.fetchval(
                        f"SELECT count(*) FROM {table} WHERE tenant = $1", self.c.tenant
                    )
                out["card_events"] = await db.fetchval(
                    "SELECT count(*) FROM card_events e JOIN cards c ON c.id = e.card_id "
                    "WHERE c.tenant = $1",
                    self.c.tenant,
                )
                out["messages"] = await db.fetchval(
                    "SELECT count(*) FROM messages m JOIN threads t ON t.id = m.thread_id "
                    "WHERE t.tenant = $1",
                    self.c.tenant,
                )
                seed = await db.fetchrow(
                    "SELECT status, decided_by, reason FROM cards WHERE id = $1", self.card["id"]
                )
                assert seed is not None
                out["seed"] = tuple(seed)
                return out
            finally:
                await db.close()

        snap: dict[str, Any] = run(take())
        return snap


@pytest.fixture(scope="module")
def target(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """One gateway; a pending card of alice's. The worker is stopped once the card exists,
    so nothing a fuzzer posts is ever run: every change would be the gateway's own."""
    with cluster(
        database_url, services.redis_url(), tmp_path_factory.mktemp("http"), gateways=1, workers=1
    ) as c:
        gw = c.gateways[0]
        auth = {"Authorization": f"Bearer {c.token('alice')}"}
        thread = httpx.post(gw.url + "/v1/threads", headers=auth).json()["thread"]["id"]
        r = httpx.post(
            f"{gw.url}/v1/threads/{thread}/messages",
            json={"text": "cobre 12 do João"},
            headers=auth,
        )
        assert r.status_code == 202
        deadline = time.monotonic() + 30
        while True:
            state = httpx.get(f"{gw.url}/v1/threads/{thread}", headers=auth).json()
            if state["pending_cards"] and state["run"]["status"] == "waiting":
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.1)
        c.workers[0].stop()
        card = state["pending_cards"][0]
        yield Target(c, database_url, card, thread, state["run"]["id"])


@pytest.fixture
def t(target: Target, invariants: Invariants) -> Iterator[Target]:
    # The worker is stopped on purpose: messages the fuzzers post stay in the inbox.
    invariants.watch_cluster(target.c, redis_url=None)
    before = target.snapshot()
    target.counts = {}
    yield target
    after = target.snapshot()
    threads_made = target.counts.get("threads_created", 0)
    assert after == {**before, "threads": before["threads"] + threads_made}, (before, after)


def typed(r: httpx.Response | Any, what: object = "") -> None:
    """A refusal is a documented 4xx with a JSON {error, message}; never a 5xx."""
    status = r.status_code
    body = r.content if hasattr(r, "content") else b""
    assert status < 500, (what, status, body[:500])
    if status >= 400:
        assert status in ERROR_STATUSES, (what, status, body[:300])
        doc = json.loads(body)
        assert isinstance(doc["error"], str) and isinstance(doc["message"], str), doc


# -- schemathesis over /openapi.json ----------------------------------------------------


def test_schemathesis_every_operation_answers_typed_4xx_never_500(
    t: Target, profile: Profile
) -> None:
    """I9: schemathesis, positive and negative cases for every operation, with the owner's
    token, with no token, and aimed at the real card, thread and run."""
    schema = schemathesis.openapi.from_url(t.url + "/openapi.json")
    seeds = {"card_id": t.card["id"], "thread_id": t.thread_id, "run_id": t.run_id}
    strategies = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        strategies += [
            schema.as_strategy(mode, headers=t.auth()),
            schema.as_strategy(mode, headers=t.auth(), path_parameters=seeds),
            schema.as_strategy(mode),
        ]
    seen: set[str] = set()

    @settings(
        max_examples=profile.hypothesis_examples * 3,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=st.one_of(strategies))
    def check(case: Any) -> None:  # a schemathesis.Case
        response = case.call(base_url=t.url, timeout=30)
        seen.add(f"{case.method} {case.operation.path}")
        typed(response, (case.method, case.formatted_path, case.body))
        if case.method == "POST" and case.operation.path == "/v1/threads":
            if response.status_code == 201:
                t.counts["threads_created"] = t.counts.get("threads_created", 0) + 1

    check()
    assert len(seen) >= 8, seen


# -- hypothesis: arbitrary bodies, queries and path segments -----------------------------

decisions = st.sampled_from(["approve", "reject", "edit", "APPROVE", "yes", ""]) | json_value
# Bodies shaped well enough to reach the store (a stale hash: never a real decision).
store_bound = st.fixed_dictionaries(
    {"decision": st.sampled_from(["approve", "reject"]), "snapshot_hash": nasty_text},
    optional={"reason": nasty_text},
)
resolve_body = st.fixed_dictionaries(
    {"decision": decisions, "snapshot_hash": st.text(max_size=80) | json_value},
    optional={
        "reason": st.text(max_size=3000) | json_value,
        "edits": json_value,
        "extra": json_value,
    },
)


def test_hypothesis_resolve_bodies_never_500_and_change_nothing(
    t: Target, profile: Profile
) -> None:
    """I9: arbitrary JSON (and raw bytes) as the decision body of the real card, from
    its owner: a typed 4xx every time, the card untouched."""
    url = f"{t.url}/v1/cards/{t.card['id']}/resolve"

    with httpx.Client(headers=t.auth(), timeout=30) as http:

        @settings(
            max_examples=profile.hypothesis_examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(
            body=store_bound | resolve_body | json_value,
            raw=st.none() | st.none() | st.binary(max_size=300) | not_utf8_json,
        )
        @example(body={"decision": "reject", "snapshot_hash": "s", "reason": "a\x00b"}, raw=None)
        @example(body={"decision": "approve", "snapshot_hash": "\x00"}, raw=None)
        @example(body={"decision": "approve", "snapshot_hash": "s", "reason": "\ud800"}, raw=None)
        @example(body=None, raw=b'{"decision":"reject","snapshot_hash":"\xff\xfe"}')
        def check(body: Any, raw: bytes | None) -> None:
            content = raw if raw is not None else json.dumps(body).encode()
            r = http.post(url, content=content, headers={"Content-Type": "application/json"})
            typed(r, content[:200])
            assert r.status_code != 200, content

        check()


def test_hypothesis_edit_values_never_500_and_change_nothing(t: Target, profile: Profile) -> None:
    """I9: arbitrary values in `edits` of the real card, from its owner. The tool's own
    parse and prepare run on them (that is where `"9"*400` and `1e308` raised
    OverflowError: a 500); the hash is stale, so a value it accepts is refused by the
    store (409). Every answer is a typed 409 or 422; the card is untouched."""
    url = f"{t.url}/v1/cards/{t.card['id']}/resolve"

    with httpx.Client(headers=t.auth(), timeout=30) as http:

        @settings(
            max_examples=profile.hypothesis_examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(
            edits=st.fixed_dictionaries(
                {}, optional={"amount": edit_value, "description": edit_value}
            ).filter(bool)
        )
        @example(edits={"amount": "9" * 400})
        @example(edits={"amount": 1e308})
        @example(edits={"amount": "1e308", "description": "x"})
        @example(edits={"amount": 10**400})
        def check(edits: dict[str, Any]) -> None:
            body = {"decision": "edit", "snapshot_hash": "0" * 64, "edits": edits}
            content = json.dumps(body).encode()  # floats: inf/nan as JSON's Infinity/NaN
            r = http.post(url, content=content, headers={"Content-Type": "application/json"})
            typed(r, content[:200])
            assert r.status_code in (403, 409, 422), (content[:200], r.status_code, r.text[:300])

        check()


def test_hypothesis_query_and_path_values_never_500(t: Target, profile: Profile) -> None:
    """I9: arbitrary `after_seq` values and path segments: typed 4xx or 200, never 500."""
    with httpx.Client(base_url=t.url, headers=t.auth(), timeout=30) as http:

        @settings(
            max_examples=profile.hypothesis_examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(
            seq=nasty_text | st.integers().map(str) | st.integers(min_value=2**63).map(str),
            segment=nasty_text.filter(bool),
        )
        @example(seq="²", segment="\x00")
        @example(seq=str(2**64), segment="\ud800")
        @example(seq="٣", segment="a/b")
        def check(seq: str, segment: str) -> None:
            # percent-encoded by hand: a lone surrogate becomes bytes that are not UTF-8
            q = quote(seq, safe="", errors="surrogatepass")
            r = http.get(f"/v1/threads/{t.thread_id}/events?after_seq={q}")
            typed(r, seq)
            s = quote(segment, safe="", errors="surrogatepass")
            for path in (f"/v1/cards/{s}", f"/v1/cards/{s}/events", f"/v1/threads/{s}"):
                typed(http.get(path), path)
            typed(http.post(f"/v1/cards/{s}/resolve", json={"x": 1}), segment)

        check()


# -- deterministic hostile payloads --------------------------------------------------------


def test_huge_deep_wrongly_typed_and_nul_payloads(t: Target) -> None:
    """I9: oversized (declared and chunked), deeply nested, wrongly typed, NUL and
    lone-surrogate payloads on the real card with its real hash: typed 4xx, card untouched,
    and an oversized body is refused without being read into memory."""
    url = f"{t.url}/v1/cards/{t.card['id']}/resolve"
    real = t.card["snapshot_hash"]
    deep = b"[" * 100_000 + b"]" * 100_000
    cases: list[tuple[str, bytes]] = [
        (
            "deep edits",
            b'{"decision":"edit","snapshot_hash":"'
            + real.encode()
            + b'","edits":{"amount":'
            + deep
            + b"}}",
        ),
        ("deep body", deep),
        (
            "decision twice",  # a proxy reading the first value sees a rejection
            b'{"decision":"reject","decision":"approve","snapshot_hash":"' + real.encode() + b'"}',
        ),
        ("deep object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        (
            "nul reason",
            json.dumps(
                {"decision": "reject", "snapshot_hash": real, "reason": "no\u0000pe"}
            ).encode(),
        ),
        (
            "nul hash",
            json.dumps({"decision": "approve", "snapshot_hash": real + "\u0000"}).encode(),
        ),
        (
            "surrogate",
            b'{"decision":"reject","snapshot_hash":"' + real.encode() + b'","reason":"\\ud800"}',
        ),
        (
            "long reason",
            json.dumps(
                {"decision": "reject", "snapshot_hash": real, "reason": "r" * 5000}
            ).encode(),
        ),
        (
            "edits on approve",
            json.dumps(
                {"decision": "approve", "snapshot_hash": real, "edits": {"amount": "1"}}
            ).encode(),
        ),
        (
            "edit nul",
            json.dumps(
                {"decision": "edit", "snapshot_hash": real, "edits": {"description": "a\u0000"}}
            ).encode(),
        ),
        (
            "edit not editable",
            json.dumps(
                {"decision": "edit", "snapshot_hash": real, "edits": {"customer_id": "x"}}
            ).encode(),
        ),
        (
            "edit 400 nines",
            json.dumps(
                {"decision": "edit", "snapshot_hash": real, "edits": {"amount": "9" * 400}}
            ).encode(),
        ),
        (
            "edit 1e308",
            json.dumps(
                {"decision": "edit", "snapshot_hash": real, "edits": {"amount": 1e308}}
            ).encode(),
        ),
        ("not utf-8 in a string", b'{"decision":"reject","snapshot_hash":"\xff\xfe"}'),
        ("types", json.dumps({"decision": ["approve"], "snapshot_hash": {"$ne": ""}}).encode()),
        ("huge int", json.dumps({"decision": "approve", "snapshot_hash": 10**400}).encode()),
        ("not json", b"\xff\xfe{"),
        ("empty", b""),
        (
            "declared big",
            json.dumps(
                {"decision": "reject", "snapshot_hash": real, "reason": "x" * 300_000}
            ).encode(),
        ),
    ]
    with httpx.Client(headers=t.auth(), timeout=30) as http:
        for name, content in cases:
            r = http.post(url, content=content, headers={"Content-Type": "application/json"})
            typed(r, name)
            assert r.status_code in (409, 413, 422), (name, r.status_code, r.text[:300])
            # Said in the input's terms, never the driver's or msgspec's misleading one.
            said = r.json()["message"]
            if name in ("nul reason", "edit nul"):
                assert "NUL" in said and "UTF8" not in said, (name, said)
            if name == "surrogate":
                assert "lone surrogate" in said, said
        for value in (
            "99999999999999999999999",
            "-99999999999999999999",
            "²",
            "٣",
            "1e3",
            " 1",
            "",
        ):
            r = http.get(f"{t.url}/v1/threads/{t.thread_id}/events", params={"after_seq": value})
            typed(r, value)
        for content in (b'{"text":"\xff"}', b'{"text":"oi \xed\xa0\x80"}', b"\xc3("):
            r = http.post(
                f"{t.url}/v1/threads/{t.thread_id}/messages",
                content=content,
                headers={"Content-Type": "application/json"},
            )
            typed(r, content)
            assert r.status_code == 422, (content, r.status_code, r.text[:300])
        batch = {
            "decisions": [{"card_id": t.card["id"], "decision": "approve", "snapshot_hash": "s"}]
            * 101
        }
        r = http.post(f"{t.url}/v1/runs/{t.run_id}/decisions", json=batch)
        typed(r, "batch of 101")
        assert r.status_code == 422

    peak_before = _peak_rss(t.c.gateways[0].popen.pid)  # type: ignore[union-attr]

    def chunks() -> Iterator[bytes]:
        block = b"x" * (1 << 20)
        for _ in range(64):  # 64 MiB, no Content-Length
            yield block

    try:
        r = httpx.post(url, content=chunks(), headers=t.auth(), timeout=30)
        typed(r, "chunked 64 MiB")
        assert r.status_code in (413, 422)
    except httpx.TransportError:
        pass  # the gateway may also just stop reading and close the connection
    grown = _peak_rss(t.c.gateways[0].popen.pid) - peak_before  # type: ignore[union-attr]
    assert grown < 16 << 20, f"the gateway read the body into memory: +{grown >> 20} MiB"


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM): catches a body read whole, then freed."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


# -- authentication and ownership ------------------------------------------------------------


def test_missing_expired_forged_tokens_and_other_owners(t: Target) -> None:
    """I3 + I9: no token, a malformed header, `alg: none`, another secret, the wrong
    issuer, an expired token, no user, a signed user or tenant no name can be: 401. Another user of the tenant, and the same user
    name in another tenant: 404, as for an id that does not exist. Nothing changes."""
    now = int(time.time())
    claims = {"iss": "signoff", "sub": "alice", "tenant": t.c.tenant, "iat": now, "exp": now + 600}
    bad_tokens = {
        "alg none": jwt.encode(claims, key=None, algorithm="none"),
        "other secret": jwt.encode(claims, "another-secret-" + "z" * 40, algorithm="HS256"),
        "wrong issuer": jwt.encode({**claims, "iss": "evil"}, SECRET, algorithm="HS256"),
        "expired": jwt.encode({**claims, "exp": now - 5}, SECRET, algorithm="HS256"),
        "no user": jwt.encode(
            {k: v for k, v in claims.items() if k != "sub"}, SECRET, algorithm="HS256"
        ),
        "tenant not text": jwt.encode({**claims, "tenant": ["x"]}, SECRET, algorithm="HS256"),
        # signed, but names no one can be: a 422 in Postgres's or the driver's words before
        "user with NUL": jwt.encode({**claims, "sub": "ali\x00ce"}, SECRET, algorithm="HS256"),
        "tenant with a lone surrogate": jwt.encode(
            {**claims, "tenant": "t\ud800"}, SECRET, algorithm="HS256"
        ),
        "user of spaces": jwt.encode({**claims, "sub": "   "}, SECRET, algorithm="HS256"),
        "user too long": jwt.encode({**claims, "sub": "a" * 300}, SECRET, algorithm="HS256"),
        "garbage": "a.b.c",
        "tampered": t.c.token("alice")[:-3] + "AAA",
    }
    headers: dict[str, dict[str, str]] = {
        name: {"Authorization": f"Bearer {tok}"} for name, tok in bad_tokens.items()
    }
    headers["missing"] = {}
    headers["empty bearer"] = {"Authorization": "Bearer"}
    headers["basic"] = {"Authorization": "Basic YWxpY2U6YWxpY2U="}
    body = {"decision": "approve", "snapshot_hash": t.card["snapshot_hash"]}
    card, thread, run_id = t.card["id"], t.thread_id, t.run_id
    requests = [
        ("POST", f"/v1/cards/{card}/resolve", body),
        ("GET", f"/v1/cards/{card}", None),
        ("GET", f"/v1/cards/{card}/events", None),
        ("GET", f"/v1/threads/{thread}", None),
        ("GET", f"/v1/threads/{thread}/events", None),
        ("POST", f"/v1/threads/{thread}/messages", {"text": "aprovado"}),
        ("POST", f"/v1/runs/{run_id}/decisions", {"decisions": [{"card_id": card, **body}]}),
    ]
    with httpx.Client(base_url=t.url, timeout=30) as http:
        for name, hdrs in headers.items():
            for method, path, payload in requests:
                r = http.request(method, path, json=payload, headers=hdrs)
                typed(r, (name, path))
                assert r.status_code == 401, (name, path, r.status_code, r.text)
        # Another user of the tenant is refused (403); to another tenant the card, the
        # thread and the run are not there at all (404, as a workflow run is): a tenant
        # cannot learn which ids exist in another.
        others = {
            "mallory": (t.auth("mallory"), 403),
            "alice of another tenant": (t.auth("alice", "other-tenant"), 404),
        }
        for name, (hdrs, status) in others.items():
            for method, path, payload in requests:
                r = http.request(method, path, json=payload, headers=hdrs)
                typed(r, (name, path))
                assert r.status_code == status, (name, path, r.status_code, r.text)
                if status == 404:
                    missing = path.replace(card, str(uuid.uuid4())).replace(
                        thread, str(uuid.uuid4())
                    )
                    missing = missing.replace(run_id, str(uuid.uuid4()))
                    gone = http.request(method, missing, json=payload, headers=hdrs)
                    assert gone.json()["error"] == r.json()["error"], (path, gone.text, r.text)


# -- clients that leave ------------------------------------------------------------------------


def test_client_gone_mid_body_ends_quietly(t: Target) -> None:
    """A client that declares a body, sends part of it and disconnects: the request ends
    with no traceback in the gateway's log (each one logged a full `ClientDisconnect`
    traceback), and the gateway goes on answering. Nothing changes (the `t` fixture)."""
    gw = t.c.gateways[0]
    before = gw.output().count("Traceback")
    paths = (f"/v1/cards/{t.card['id']}/resolve", f"/v1/threads/{t.thread_id}/messages")
    for path in paths:
        for cut in (0, 1, 9):
            head = (
                f"POST {path} HTTP/1.1\r\nHost: gw\r\n"
                f"Authorization: {t.auth()['Authorization']}\r\n"
                "Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
            )
            with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as conn:
                conn.sendall(head.encode() + b'{"decision": "reject"}'[:cut])
                time.sleep(0.05)  # let the gateway start reading the body
    # The gateway still answers; a traceback would have been logged by now (it is logged
    # as the disconnect is read, well before this second request is served).
    typed(httpx.get(f"{t.url}/v1/threads/{t.thread_id}", headers=t.auth(), timeout=10))
    time.sleep(0.5)
    assert gw.output().count("Traceback") == before, gw.output()[-3000:]


# -- bytes h11 cannot parse, and ambiguous framing ---------------------------------------


def _raw(port: int, request: bytes, settle: float = 0.3) -> bytes:
    """Send raw bytes, read until the gateway closes (or ``settle`` of silence)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        conn.settimeout(settle + 2)
        got = b""
        while True:
            try:
                part = conn.recv(65536)
            except TimeoutError:
                return got + b"<open>"
            if not part:
                return got
            got += part


def _answer(raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body.removesuffix(b"<open>"))


def test_unparseable_bytes_get_a_typed_400_and_end_quietly(t: Target) -> None:
    """A malformed chunk after a request's headers (its handler already running), two
    Content-Lengths, a NUL in a header: a JSON 400 ``bad_request`` (uvicorn's was
    text/plain), the connection closed, nothing created, and no ERROR or traceback in
    the gateway's log (an unauthenticated client could make it log one per request: the
    handler's answer met a connection h11 had already failed)."""
    gw = t.c.gateways[0]
    before = gw.output()
    auth = t.auth()["Authorization"].encode()
    cases = {
        "bad chunk, authenticated": b"POST /v1/threads HTTP/1.1\r\nHost: gw\r\nAuthorization: "
        + auth
        + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",
        "bad chunk, no token": b"POST /v1/threads HTTP/1.1\r\nHost: gw\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        "bad chunk, a card": f"POST /v1/cards/{t.card['id']}/resolve HTTP/1.1\r\n".encode()
        + b"Host: gw\r\nAuthorization: "
        + auth
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
        "two lengths": b"POST /v1/threads HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n"
        b"Content-Length: 3\r\n\r\n{}",
        "NUL in a header": b"GET /v1/threads HTTP/1.1\r\nHost: gw\r\nX-A: a\x00b\r\n\r\n",
    }
    for name, request in cases.items():
        for _ in range(3):
            raw = _raw(gw.port, request)
            assert not raw.endswith(b"<open>"), (name, raw)  # closed
            status, headers, body = _answer(raw)
            assert status == 400, (name, raw)
            assert headers["content-type"] == "application/json", (name, raw)
            assert body["error"] == "bad_request" and body["message"], (name, body)
    typed(httpx.get(f"{t.url}/v1/threads/{t.thread_id}", headers=t.auth(), timeout=10))
    time.sleep(0.5)  # a handler's failed answer would be logged by now
    new = gw.output()[len(before) :]
    assert "Traceback" not in new and "ERROR" not in new, new[-3000:]


def test_both_framings_are_refused_and_the_connection_closed(t: Target) -> None:
    """Transfer-Encoding and Content-Length together (request smuggling's shape behind a
    proxy that reads the other one): a typed 400 before any handler runs, the connection
    closed, nothing created (it was answered 201 and kept alive)."""
    gw = t.c.gateways[0]
    auth = t.auth()["Authorization"].encode()
    request = (
        b"POST /v1/threads HTTP/1.1\r\nHost: gw\r\nAuthorization: " + auth + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        b"GET /v1/threads HTTP/1.1\r\nHost: gw\r\nAuthorization: " + auth + b"\r\n\r\n"
    )
    raw = _raw(gw.port, request)
    assert not raw.endswith(b"<open>"), raw
    assert raw.count(b"HTTP/1.1 ") == 1, raw  # the second request was never read
    status, headers, body = _answer(raw)
    assert (status, headers["connection"], body["error"]) == (400, "close", "bad_request")


def test_a_websocket_upgrade_on_another_path_is_a_typed_404(t: Target) -> None:
    """It was a bare 403 with an empty body (and on /static an ERROR in the gateway's log:
    the static files' handler met a WebSocket); the real path still upgrades."""
    gw = t.c.gateways[0]
    before = gw.output()
    for path in ("/v1/threads", "/nowhere", "/v1/ws/extra", "/static/app.js"):
        upgrade = (
            f"GET {path} HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        status, headers, body = _answer(_raw(gw.port, upgrade))
        assert status == 404, (path, status, body)
        assert headers["content-type"] == "application/json", (path, headers)
        assert body["error"] == "not_found", (path, body)
    ok = _raw(gw.port, upgrade.replace(b"GET /static/app.js ", b"GET /v1/ws "))
    assert ok.startswith(b"HTTP/1.1 101 "), ok[:200]
    time.sleep(0.3)
    new = gw.output()[len(before) :]
    assert "ERROR" not in new and "Traceback" not in new, new[-3000:]
