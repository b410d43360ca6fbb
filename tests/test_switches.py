"""The env-switch reader behind SFIBENCH_PDL, SFIBENCH_QKV_EPILOGUE and SFIBENCH_FOLD_INPUT_NORM."""

import pytest

from sfibench.core.errors import UsageError
from sfibench.switches import read_switch

CHOICES = {"1": "on", "0": "off"}


def test_unset_gives_the_default_and_a_set_value_is_returned(monkeypatch):
    monkeypatch.delenv("SFIBENCH_TEST_SWITCH", raising=False)
    assert read_switch("SFIBENCH_TEST_SWITCH", CHOICES, "1") == "1"
    monkeypatch.setenv("SFIBENCH_TEST_SWITCH", "0")
    assert read_switch("SFIBENCH_TEST_SWITCH", CHOICES, "1") == "0"


def test_a_bad_value_names_the_variable_the_value_every_choice_and_the_default(monkeypatch):
    monkeypatch.setenv("SFIBENCH_TEST_SWITCH", "yes")
    with pytest.raises(UsageError) as caught:
        read_switch("SFIBENCH_TEST_SWITCH", CHOICES, "1")
    message = str(caught.value)
    for part in ("SFIBENCH_TEST_SWITCH='yes'", "1 = on", "0 = off", "unset means 1"):
        assert part in message
