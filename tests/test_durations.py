"""One duration grammar (gpufleet/durations.py) for alert rules and API windows alike."""

from __future__ import annotations

import pytest

from gpufleet.durations import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), (90, 90), (1.5, 1.5), ("250ms", 0.25), ("90s", 90), ("30m", 1800), (" 4h ", 14400),
    ("7d", 604800), ("2w", 1209600), ("1.5h", 5400),
])
def test_accepted_forms(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-5m", "5 minutes", "1:30", "PT1H", True, -3, "5y"])
def test_refused_forms_say_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match=r"30m|negative"):
        parse_duration(text)  # type: ignore[arg-type]


def test_api_and_alerts_read_the_same_units() -> None:
    from gpufleet.alerts.config import parse_duration as alert_duration
    from gpufleet.api.queries.common import BadRequest
    from gpufleet.api.queries.common import parse_duration as api_duration

    for text in ("45s", "30m", "4h", "2d", "1w"):
        assert alert_duration(text) == api_duration(text) == parse_duration(text)
    with pytest.raises(BadRequest, match="window='soon'"):
        api_duration("soon")
    from gpufleet.alerts.config import ConfigError

    with pytest.raises(ConfigError, match="lease: expected a duration"):
        alert_duration("soon", "lease")
