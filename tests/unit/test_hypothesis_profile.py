"""The unit tier's hypothesis profile (tests/unit/conftest.py) is the one in force."""

from hypothesis import settings


def test_the_unit_profile_has_no_deadline_and_prints_the_reproduction_blob():
    assert settings.default.deadline is None and settings.default.print_blob is True
