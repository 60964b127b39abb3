"""One function checks every value of every command's options from its field's facts (settings/validation.py),
in the words of whoever gave the value: `--lr 2e5` on the command line, `lr=200000.0` in Python."""

from __future__ import annotations

import dataclasses

import pytest

from mirrorbert.errors import UserError
from mirrorbert.settings.fields import Interval, field_of, flag_names, option, say
from mirrorbert.settings.validation import Options


@dataclasses.dataclass(kw_only=True)
class Knobs(Options):
    name: str | None = option(None, help="a name", required=True, note="what it is called")
    rate: float = option(0.1, help="a rate", range="(0, 1]")
    count: int = option(1, help="a count", range="[1, inf)", why="one at least")
    opset: int = option(18, help="an opset", range="[14, 23]")
    mode: str = option("a", help="a mode", choices=("a", "b"))
    label: str = option("x", help="a label")
    seeds: tuple[int, ...] = option((0,), help="seeds", range="[0, 9]")
    flag: bool = option(False, help="a switch", flag="--switch")
    first: str | None = option(None, help="one of two", excludes=("second",))
    second: str | None = option(None, help="the other of two")
    internal: int = 0  # not an option: no flag, no checks

    def rules(self) -> None:
        if self.mode == "b" and self.count > 5:
            raise UserError(f"{self.say('mode', 'b')} takes at most 5 of {self.say('count')}")


@pytest.mark.parametrize("values, python, cli", [
    ({"rate": 2e5}, "rate=200000.0: outside (0, 1]; did you mean 2e-05?",
     "--rate 200000.0: outside (0, 1]; did you mean 2e-05?"),
    ({"rate": 10.0}, "rate=10.0: outside (0, 1]; did you mean 0.1?", "--rate 10.0: outside (0, 1]; did you mean 0.1?"),
    ({"rate": -1.0}, "rate=-1.0: outside (0, 1]", "--rate -1.0: outside (0, 1]"),
    ({"rate": float("inf")}, "rate=inf: must be a finite number", "--rate inf: must be a finite number"),
    ({"count": 0}, "count=0: must be an integer >= 1 (one at least)", "--count 0: must be an integer >= 1 (one at least)"),
    ({"opset": 9}, "opset=9: must be a whole number from 14 to 23", "--opset 9: must be a whole number from 14 to 23"),
    ({"mode": "c"}, "mode='c': not one of a, b", "--mode c: not one of a, b"),
    ({"label": " "}, "label= must not be empty", "--label must not be empty"),
    ({"seeds": (1, 10)}, "seeds=10: must be a whole number from 0 to 9", "--seeds 10: must be a whole number from 0 to 9"),
    ({"seeds": ()}, "seeds= must not be empty", "--seeds must not be empty"),
    ({"count": "2"}, "count= must be a whole number, not '2' (text)", "--count must be a whole number, not '2' (text)"),
    ({"flag": 1}, "flag= must be true or false, not 1 (int)", "--switch must be true or false, not 1 (int)"),
    ({"first": "x", "second": "y"}, "first= and second=: give one of them, not both",
     "--first and --second: give one of them, not both"),
    ({"mode": "b", "count": 6}, "mode='b' takes at most 5 of count=", "--mode b takes at most 5 of --count"),
])
def test_a_bad_value_is_named_as_its_giver_wrote_it(values, python, cli):
    with pytest.raises(UserError) as info:
        Knobs(**values)
    assert str(info.value) == python
    with flag_names(), pytest.raises(UserError) as info:
        Knobs(**values)
    assert str(info.value) == cli


def test_required_options_are_asked_for_when_the_options_are_to_run():
    knobs = Knobs()  # may be made without them, and completed later
    with pytest.raises(UserError, match=r"^name= is required \(what it is called\)$"):
        knobs.validate()
    with flag_names(), pytest.raises(UserError, match=r"^--name is required \(what it is called\)$"):
        Knobs().validate()
    with flag_names(), pytest.raises(UserError, match=r"^--name must not be empty$"):
        Knobs(name=" ").validate()
    Knobs(name="n").validate()


def test_a_refused_setting_leaves_the_old_value_and_a_non_option_is_not_checked():
    knobs = Knobs(name="n", first="x")
    with pytest.raises(UserError, match="not both"):
        knobs.second = "y"
    assert knobs.second is None
    knobs.rate = 0.5
    knobs.internal = -5
    assert (knobs.rate, knobs.internal) == (0.5, -5)
    assert Knobs(seeds=[1, 2]).seeds == (1, 2)  # a list given for a tuple field is made the field's type


def test_intervals_hold_their_bounds_open_or_closed():
    closed, open_, half = Interval.parse("[0, 1]"), Interval.parse("(0, 1)"), Interval.parse("[1, inf)")
    assert closed.holds(0) and closed.holds(1) and not open_.holds(0) and not open_.holds(1) and open_.holds(0.5)
    assert half.holds(10**12) and not half.holds(0)
    with pytest.raises(ValueError, match="not an interval"):
        Interval.parse("0 to 1")


def test_say_names_a_value_as_the_command_line_would_be_typed():
    f = field_of(Knobs, "label")
    with flag_names():
        assert say(f, "two words") == "--label 'two words'" and say(field_of(Knobs, "seeds"), (1, 2)) == "--seeds 1,2"
    assert say(f, "two words") == "label='two words'" and say(f) == "label="
