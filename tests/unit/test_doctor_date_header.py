"""Consul's Date header comes from the network: doctor judges the clock skew from it, and
one it cannot read is a warning naming the header, never a traceback."""

from __future__ import annotations

import email.utils
import time

import pytest

from azprobe.commands import doctor


@pytest.mark.parametrize("header", [
    "garbage",
    "Mon, 99 Jan 2020 00:00:00 GMT",  # datetime refuses the day
    "Mon, 1 Jan 99999999999 00:00:00 GMT",  # OverflowError, not ValueError
    "Mon, 1 Jan 2020 25:00:00 GMT",
])
def test_an_unparseable_date_is_a_warning_naming_it(header):
    check = doctor.clock_skew_check(1000.0, 1000.1, header)
    assert check.name == "consul.clock_skew" and check.status == doctor.WARN
    assert check.detail == f'Consul\'s Date header "{header}" is not an HTTP date: cannot measure clock skew'
    assert check.fix


@pytest.mark.parametrize("header", [None, ""])
def test_a_missing_date_is_a_warning(header):
    check = doctor.clock_skew_check(1000.0, 1000.1, header)
    assert check.status == doctor.WARN and "no Date header" in check.detail


def test_the_echoed_header_is_printable_and_bounded():
    check = doctor.clock_skew_check(1000.0, 1000.1, "\x1b[2J\x1b]0;pwned\x07" + "x" * 5000)
    assert check.status == doctor.WARN
    assert check.detail.isascii() and check.detail.isprintable()
    assert "\\x1b[2J" in check.detail
    assert len(check.detail) < 200


def test_skew_bounds_refuses_a_bad_date_with_value_error():
    with pytest.raises(ValueError, match="is not an HTTP date"):
        doctor.skew_bounds(1000.0, 1000.1, "Mon, 1 Jan 99999999999 00:00:00 GMT")


def test_a_good_date_is_still_judged():
    assert doctor.clock_skew_check(1000.6, 1000.8, email.utils.formatdate(1000.7, usegmt=True)).status == doctor.OK


def test_a_minus_0000_date_is_utc_not_local_time(monkeypatch):
    # RFC 5322's "-0000": UTC with the sender's zone unknown; it parses to a naive datetime.
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        header = email.utils.formatdate(5000.3).replace("+0000", "-0000")
        assert header.endswith("-0000")
        assert doctor.clock_skew_check(5000.29, 5000.31, header).status == doctor.OK
    finally:
        monkeypatch.undo()
        time.tzset()
