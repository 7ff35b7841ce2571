"""Knob validation that names the field and the rule it broke (kvplane is the base every package builds on)."""
import math


def check(ok: bool, field: str, rule: str, value: object) -> None:
    """Raise a ValueError naming `field` when `ok` is false."""
    if not ok:
        raise ValueError(f"{field} must be {rule}, got {value!r}")


def check_positive(field: str, value: float) -> None:
    """`value` is a finite number above zero."""
    check(math.isfinite(value) and value > 0, field, "a finite number > 0", value)


def check_at_least(field: str, value: float, minimum: float) -> None:
    """`value` is a finite number at or above `minimum`."""
    check(math.isfinite(value) and value >= minimum, field, f"a finite number >= {minimum}", value)


def check_non_negative(field: str, value: float) -> None:
    """`value` is a finite number at or above zero."""
    check_at_least(field, value, 0.0)


def check_fraction(field: str, value: float) -> None:
    """`value` lies in (0, 1]: a share or a smoothing factor."""
    check(0.0 < value <= 1.0, field, "in (0, 1]", value)


def check_count(field: str, value: int, minimum: int) -> None:
    """`value` is an integer (not a bool) at or above `minimum`."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    check(is_int and value >= minimum, field, f"an int >= {minimum}", value)
