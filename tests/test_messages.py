"""Wire messages: every bad frame is a MessageError with its reason, nothing else escapes."""

from __future__ import annotations

import pytest

from contract.messages import (
    MAX_FRAME,
    VERSION,
    MessageError,
    Reason,
    Report,
    decode,
    decode_report,
    new_secret,
    secret_key,
    verify,
)

KEY = secret_key(new_secret())
GOOD_PAYLOAD = '{"samples":64,"timestamp":1000.5,"world_size":2,"generation":3,"worker":"w0"}'


def frame(payload: str = GOOD_PAYLOAD, *, v: int = VERSION, seq: str = "1", job: str = '"j1"') -> bytes:
    return f'{{"v":{v},"type":"report","job":{job},"seq":{seq},"payload":{payload}}}'.encode()


def reason_of(data: bytes) -> Reason:
    with pytest.raises(MessageError) as info:
        decode_report(decode(data))
    return info.value.reason


def test_round_trip_signed_and_unsigned() -> None:
    rep = Report("j1", 7, 64, 1000.5, 2, 3, "w0")
    signed = rep.encode(KEY)
    env = decode(signed)
    assert env.signed and decode_report(env) == rep
    verify(signed, KEY)
    assert not decode(rep.encode()).signed
    assert decode_report(decode(rep.encode())) == rep
    again = Report("j1", 1, 64, 1000.5, 2, 3, "w0", incarnation=4)  # the same worker, restarted
    assert decode_report(decode(again.encode(KEY))) == again


def test_a_report_without_an_incarnation_is_incarnation_0() -> None:
    """The format before incarnations (GOOD_PAYLOAD has none) decodes as the worker's incarnation 0."""
    assert decode_report(decode(frame())).incarnation == 0


@pytest.mark.parametrize("value", ['"1"', "null", "-1", "1.5", "true", "9223372036854775808"])
def test_a_bad_incarnation_is_a_bad_field_naming_it(value: str) -> None:
    payload = GOOD_PAYLOAD[:-1] + f',"incarnation":{value}}}'
    with pytest.raises(MessageError, match="incarnation") as info:
        decode_report(decode(frame(payload)))
    assert info.value.reason is Reason.BAD_FIELD


@pytest.mark.parametrize("gen", ['"abc"', "null", "[1]", "1e400", "-1", "1.5", "true", "9223372036854775808"])
def test_bad_generation_is_a_bad_field(gen: str) -> None:
    payload = GOOD_PAYLOAD.replace('"generation":3', f'"generation":{gen}')
    assert reason_of(frame(payload)) is Reason.BAD_FIELD


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("samples", "1" + "0" * 400),  # 10^400
        ("samples", "-5"),
        ("samples", "2147483648"),
        ("samples", "1.0"),
        ("timestamp", "NaN"),
        ("timestamp", "Infinity"),
        ("timestamp", "-Infinity"),
        ("timestamp", "1e400"),
        ("timestamp", "-1"),
        ("timestamp", '"now"'),
        ("world_size", "0"),
        ("world_size", "-2"),
        ("world_size", "65537"),
        ("world_size", "null"),
        ("worker", "7"),
        ("worker", '"a\\nb"'),
        ("worker", '"' + "w" * 300 + '"'),
    ],
)
def test_out_of_range_or_mistyped_fields_are_bad_fields(field: str, value: str) -> None:
    payload = {
        "samples": '64', "timestamp": '1000.5', "world_size": '2', "generation": '3', "worker": '"w0"',
    }
    payload[field] = value
    text = "{" + ",".join(f'"{k}":{v}' for k, v in payload.items()) + "}"
    assert reason_of(frame(text)) is Reason.BAD_FIELD


def test_missing_and_unknown_fields() -> None:
    assert reason_of(frame('{"timestamp":1.0,"world_size":1}')) is Reason.BAD_FIELD
    assert reason_of(frame(GOOD_PAYLOAD[:-1] + ',"extra":1}')) is Reason.BAD_FIELD


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[" * 100_000, Reason.OVERSIZE),
        (b"[" * (MAX_FRAME - 1), Reason.NOT_JSON),  # deep nesting: RecursionError inside
        (b"{" * 1500, Reason.NOT_JSON),
        (b"\xff\xfe", Reason.NOT_JSON),
        (b"", Reason.NOT_JSON),
        (b"garbage", Reason.NOT_JSON),
        (b"{} {}", Reason.NOT_JSON),
        (b"1" * 1000, Reason.MALFORMED),  # a 1000-digit number: JSON, not an envelope
        (b"[1]", Reason.MALFORMED),
        (b'{"v":2}', Reason.MALFORMED),
        (frame(v=1), Reason.BAD_VERSION),
        (frame(v=3), Reason.BAD_VERSION),
        (b'{"v":"2","type":"report"}', Reason.BAD_VERSION),
        (frame(seq="0"), Reason.MALFORMED),
        (frame(seq='"1"'), Reason.MALFORMED),
        (frame(seq="1" + "0" * 400), Reason.MALFORMED),
        (frame(job="[1]"), Reason.MALFORMED),
        (frame(job="null"), Reason.MALFORMED),
        (frame(payload="[]"), Reason.MALFORMED),
        (frame()[:-1] + b',"more":1}', Reason.MALFORMED),
    ],
)
def test_bad_frames_have_a_reason(data: bytes, reason: Reason) -> None:
    assert reason_of(data) is reason


def test_signature_checks() -> None:
    rep = Report("j1", 1, 64, 1000.5, 2, 0, "w0")
    other = secret_key(new_secret())
    with pytest.raises(MessageError) as info:
        verify(rep.encode(other), KEY)  # signed for another job
    assert info.value.reason is Reason.BAD_SIGNATURE
    good = rep.encode(KEY)
    tampered = good.replace(b'"samples":64', b'"samples":65')
    with pytest.raises(MessageError, match="does not match"):
        verify(tampered, KEY)
    with pytest.raises(MessageError, match="last member"):
        verify(rep.encode(), KEY)
    moved = b'{"sig":"' + good[-66:-2] + b'",' + good[1:-74] + b"}"
    assert decode(moved).signed
    with pytest.raises(MessageError, match="last member"):
        verify(moved, KEY)


def test_secret_format_is_checked() -> None:
    assert len(secret_key(new_secret())) == 32
    for bad in ("", "xyz", "ab" * 31, "zz" * 32):
        with pytest.raises(ValueError, match="MALLETRAIN_JOB_SECRET"):
            secret_key(bad)
