"""The package stays `ruff` clean, `ruff format`ted and `mypy --strict` clean: checked with every test run."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

from tests.conftest import REPO


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )


def test_ruff() -> None:
    result = run("ruff", "check", "operator", "devcluster", "tests", "e2e", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = run("ruff", "format", "--check", "operator", "devcluster", "tests", "e2e", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = run("mypy")  # configured in pyproject.toml: strict, on the package
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_layers() -> None:
    """The contracts in pyproject.toml ([tool.importlinter]): pure modules do no I/O, handlers stay thin."""
    result = subprocess.run(
        [pathlib.Path(sys.executable).with_name("lint-imports"), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_flows_fakes_import_no_adapter() -> None:
    """They stand for the ports (mypy checks them against each Protocol), not for what implements them."""
    tree = ast.parse((REPO / "tests/unit/flow/fakes.py").read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert [name for name in imported if name.startswith("celery_event_operator.adapters")] == []


def test_the_e2e_suite_collects() -> None:
    """e2e/ runs after the rest of ./dev test (on a node of its own): its modules are imported with every run too."""
    result = run("pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "e2e")
    assert result.returncode == 0, result.stdout + result.stderr
