import pytest

from autotune._units import parse_duration
from autotune.errors import AutotuneError


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("2m", 120), ("1m30s", 90), ("1.5h", 5400), ("45", 45), (7, 7)])
def test_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "2 parsecs", "-5", "0", "1m soon"])
def test_reject(text):
    with pytest.raises(AutotuneError, match="Budget must be"):
        parse_duration(text)
