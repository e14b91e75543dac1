"""Fuzz: no bytes and no JSON value make the monitor or the control parser raise anything but their own errors."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malletrain.daemon.control import Caller, RequestError, parse_request, unpack_body
from contract.messages import Report, new_secret, secret_key, sign
from malletrain.daemon.monitor import Monitor

SECRET = new_secret()
KEY = secret_key(SECRET)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ("samples", "timestamp", "world_size", "generation", "worker")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def monitor() -> Monitor:
    # a clock that moves 1 s per reading: what the rate bound lets through never depends on the machine's speed
    mon = Monitor(clock=itertools.count(0.0, 1.0).__next__)
    mon.register("j1", SECRET)
    return mon


def signed(payload: Any, seq: Any = 1) -> bytes:
    body = json.dumps({"v": 2, "type": "report", "job": "j1", "seq": seq, "payload": payload},
                      separators=(",", ":")).encode()
    return body[:-1] + b',"sig":"' + sign(body[:-1], KEY) + b'"}'


@SETTINGS
@given(st.lists(st.binary(max_size=3000), max_size=20))
def test_random_bytes_are_counted_never_raised(frames: list[bytes]) -> None:
    mon = monitor()
    try:
        mon.ingest_batch(frames + [Report("j1", 10**6, 8, 5.0, 1).encode(KEY)])
        c = mon.counts()
        assert c["received"] == c["accepted"] + c["rejected"] and c["internal"] == 0
        assert c["accepted"] >= 1 and list(mon.jobs) == ["j1"]
    finally:
        mon.close()


@SETTINGS
@given(st.dictionaries(st.sampled_from(FIELDS + ("extra",)), json_values, max_size=6), json_values)
def test_signed_payloads_of_any_shape_are_validated(payload: dict[str, Any], seq: Any) -> None:
    mon = monitor()
    try:
        mon.ingest_batch([signed(payload), signed(payload, seq)])
        c = mon.counts()
        assert c["received"] == 2 == c["accepted"] + c["rejected"] and c["internal"] == 0
        st_ = mon.jobs["j1"]
        assert 0 <= st_.samples <= 2 * (2**31 - 1) and 0 <= st_.world_size <= 65536
    finally:
        mon.close()


@SETTINGS
@given(json_values | st.dictionaries(st.sampled_from(("cmd", "id", "spec", "x")), json_values, max_size=4))
def test_control_requests_parse_or_are_refused(obj: Any) -> None:
    try:
        parse_request(obj, Caller(1000, 1000, False))
    except RequestError as exc:
        assert exc.reason in ("malformed", "unknown_cmd", "bad_field")


@SETTINGS
@given(st.binary(max_size=2000))
def test_control_bodies_parse_or_are_refused(body: bytes) -> None:
    try:
        unpack_body(body, "request")
    except RequestError as exc:
        assert exc.reason == "not_json"
