"""errors.brief: the one way a problem's message is cut down for a log line or a report."""

from policystore.errors import brief


def test_brief_keeps_the_first_line_within_the_limit_and_survives_an_empty_message():
    assert brief(ValueError("first line\n  Traceback (most recent call last): ...")) == "first line"
    assert brief(ValueError("x" * 500)) == "x" * 200 and brief(ValueError("x" * 500), 10) == "x" * 10
    assert brief(TimeoutError()) == "" and brief(OSError("\n")) == ""  # an IndexError here once lost a report
