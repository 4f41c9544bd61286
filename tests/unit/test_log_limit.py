"""The per-key log limiter, and client errors logged as one rate-limited line."""

from __future__ import annotations

import logging

import grpc
import pytest

from powertrip.services.common import errors
from powertrip.services.common.errors import BadRequest, translate_errors
from powertrip.services.common.log_limit import OVERFLOW_KEY, LogLimiter, one_line


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_per_key_passes_then_the_rest_is_counted_and_summarised(caplog):
    clock = Clock()
    log = logging.getLogger("test.limiter")
    limiter = LogLimiter(burst=3, interval_s=60, logger=log, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.limiter"):
        assert [limiter.allow(("M", "NOT_FOUND")) for _ in range(10)] == [True] * 3 + [False] * 7
        assert limiter.allow(("M", "INVALID_ARGUMENT"))  # another key has its own budget
        assert limiter.suppressed(("M", "NOT_FOUND")) == 7
        assert caplog.text == ""
        clock.now += 61  # the window ends: one summary, then a fresh burst
        assert limiter.allow(("M", "NOT_FOUND"))
    assert caplog.messages == ["suppressed 7 similar lines (M NOT_FOUND) in the last 61 s"]


def test_flush_reports_ended_windows_without_a_new_event(caplog):
    clock = Clock()
    limiter = LogLimiter(burst=1, interval_s=10, logger=logging.getLogger("t.f"), clock=clock)
    for _ in range(4):
        limiter.allow("k")
    with caplog.at_level(logging.WARNING, logger="t.f"):
        limiter.flush()  # window still open: nothing yet
        clock.now += 10
        limiter.flush()
        limiter.flush()  # reported once
    assert caplog.messages == ["suppressed 3 similar lines (k) in the last 10 s"]


def test_keys_beyond_the_cap_share_one_overflow_window():
    limiter = LogLimiter(burst=1, interval_s=10, max_keys=2, clock=Clock())
    assert limiter.allow("a") and limiter.allow("b")
    assert limiter.allow("c")  # the overflow window's one line
    assert not limiter.allow("d")
    assert limiter.suppressed(OVERFLOW_KEY) == 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        LogLimiter(burst=0)


def test_one_line_flattens_cuts_and_neutralises_client_text():
    assert one_line("a\nb\t c") == "a b c"
    assert one_line("x" * 500, limit=20) == "x" * 17 + "..."
    assert one_line("id\x1b[31m") == "id?[31m"


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    def code(self) -> grpc.StatusCode | None:
        return self.status[0] if self.status else None

    def peer(self) -> str:
        return "ipv4:10.0.0.9:5555"

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise Aborted


class Servicer:
    @translate_errors
    def Refuse(self, request, context):  # noqa: N802
        raise BadRequest(f"bad id {request!r}\nsecond line")

    @translate_errors
    def Crash(self, request, context):  # noqa: N802
        raise ZeroDivisionError("bug")


@pytest.fixture
def fresh_limiter(monkeypatch):
    limiter = LogLimiter(burst=2, interval_s=60, logger=errors.logger, clock=Clock())
    monkeypatch.setattr(errors, "LIMITER", limiter)
    return limiter


def test_a_client_error_is_one_line_with_method_peer_code_and_reason(fresh_limiter, caplog):
    with caplog.at_level(logging.INFO, logger="powertrip.services.common.errors"):
        for _ in range(5):
            ctx = FakeContext()
            with pytest.raises(Aborted):
                Servicer().Refuse("x" * 5000, ctx)
            assert ctx.status[0] is grpc.StatusCode.INVALID_ARGUMENT
            assert len(ctx.status[1]) <= errors.MAX_DETAIL_CHARS
    assert len(caplog.records) == 2  # the burst; 3 more counted
    record = caplog.records[0]
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert record.getMessage().startswith(
        "rejected method=Servicer.Refuse peer=ipv4:10.0.0.9:5555 code=INVALID_ARGUMENT reason=bad"
    )
    assert len(record.getMessage()) < 300
    assert fresh_limiter.suppressed(("Servicer.Refuse", "INVALID_ARGUMENT")) == 3


def test_a_server_bug_keeps_its_traceback_within_the_limit(fresh_limiter, caplog):
    with caplog.at_level(logging.INFO, logger="powertrip.services.common.errors"):
        for _ in range(4):
            ctx = FakeContext()
            with pytest.raises(Aborted):
                Servicer().Crash(None, ctx)
            assert ctx.status == (grpc.StatusCode.INTERNAL, "internal error")
    assert len(caplog.records) == 2
    assert all(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)
