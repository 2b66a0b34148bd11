"""Waiting on conditions with deadlines: the one place tests poll (no bare sleeps elsewhere)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    probe: Callable[[], T],
    timeout: float = 10,
    interval: float = 0.1,
    message: str = "condition not reached",
    retrying: tuple[type[BaseException], ...] = (AssertionError,),
) -> T:
    """Poll until `probe` returns a truthy value (returned); exceptions in `retrying` count as "not yet"."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = probe()
            if result:
                return result
        except retrying as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} within {timeout}s; last: {last_error!r}")
        time.sleep(interval)


def eventually_equal(
    probe: Callable[[], T], expected: T, timeout: float = 10, interval: float = 0.1, message: str = "not as expected"
) -> None:
    """Poll until `probe` returns `expected` (what arrives a moment later, such as kopf's Events, which it posts
    from a queue of its own after the status is written); the failure shows the last value."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found == expected:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} within {timeout}s: {found!r} != {expected!r}")
        time.sleep(interval)


def stays(probe: Callable[[], object], seconds: float, interval: float = 0.1, message: str = "condition broke") -> None:
    """Check that `probe` holds throughout `seconds` (something must *not* happen); fails at once when not."""
    deadline = time.monotonic() + seconds
    while True:
        if not probe():
            raise AssertionError(f"{message} before {seconds}s passed")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


def once_quiet(probe: Callable[[], T], quiet_seconds: float, timeout: float = 60, interval: float = 0.5) -> T:
    """`probe`'s value once it stayed the same for `quiet_seconds` (what is still settling has settled)."""
    deadline = time.monotonic() + timeout
    value, since = probe(), time.monotonic()
    while True:
        time.sleep(interval)
        now, current = time.monotonic(), probe()
        if current != value:
            value, since = current, now
        elif now - since >= quiet_seconds:
            return value
        if now >= deadline:
            raise AssertionError(f"still changing after {timeout}s: {value!r}")
