"""Prometheus' own text parser (prometheus/common's expfmt, what `promtool check metrics` runs), for the tests.

prometheus_client's Python parser accepts what Prometheus refuses (a value of 310 digits: Go's ParseFloat is out of
range, and the whole scrape is lost), so an exposition is checked by the real one too: devcluster/promparse, built
from the Go module proxy into the cache beside the control plane by `./dev setup` (its build.sh costs a hash once
built). One process answers every check of a test run (`promparse -serve`): fuzzing asks it hundreds of times.
"""

from __future__ import annotations

import functools
import subprocess
import threading

from tests.conftest import REPO

BUILD = REPO / "devcluster" / "promparse" / "build.sh"


@functools.cache
def binary() -> str:
    """The built parser's path (built first if the cache lacks it: Go is needed then)."""
    built = subprocess.run([str(BUILD)], check=True, capture_output=True, text=True, timeout=600)
    return built.stdout.strip().splitlines()[-1]


class _Server:
    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [binary(), "-serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._lock = threading.Lock()

    def check(self, text: bytes) -> str | None:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        with self._lock:
            self._process.stdin.write(b"%d\n" % len(text) + text)
            self._process.stdin.flush()
            answer = self._process.stdout.readline().decode().rstrip("\n")
        assert answer, f"promparse exited: {self._process.stderr.read().decode() if self._process.stderr else ''}"
        return None if answer.startswith("ok ") else answer.removeprefix("error: ")


@functools.cache
def _server() -> _Server:
    return _Server()


def refusal(text: bytes) -> str | None:
    """Why Prometheus' parser refuses the exposition `text` (a series written twice included); None when it
    accepts it."""
    return _server().check(text)
