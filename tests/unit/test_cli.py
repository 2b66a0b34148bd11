"""Commands of other distributions join the command line through the entry point group; absent, they say how to
install them (the operator's wheel and image carry no dev cluster: tests/test_packaging.py)."""

from __future__ import annotations

import importlib.metadata

import pytest

from celery_event_operator import cli


@pytest.mark.parametrize(
    "installed",
    [
        pytest.param([], id="not installed"),
        pytest.param(
            [
                importlib.metadata.EntryPoint(
                    name="dev",
                    value="celery_event_devcluster_removed.command:add_command",
                    group=cli.COMMANDS_ENTRY_POINTS,
                )
            ],
            id="removed, its metadata left behind",
        ),
    ],
)
@pytest.mark.parametrize("arguments", [[], ["--api-port", "0", "-v"], ["--help"]], ids=["bare", "flags", "help"])
def test_an_absent_dev_cluster_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    installed: list[importlib.metadata.EntryPoint],
    arguments: list[str],
) -> None:
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: installed)
    listed = " ".join(cli.build_parser().format_help().split())
    assert "dev (not installed) the distribution celery-event-devcluster" in listed
    assert cli.main(["dev", *arguments]) == 2
    error = capsys.readouterr().err
    assert "the command 'dev' is not installed" in error
    assert "pip install -e ./devcluster" in error


def test_the_installed_dev_cluster_adds_its_own_parser() -> None:
    parsed = cli.build_parser().parse_args(["dev", "--api-port", "0", "--metrics-port", "0"])
    assert (parsed.api_port, parsed.metrics_port, parsed.resync_seconds) == (0, 0, 10.0)
    assert parsed.handler.__module__ == "celery_event_devcluster.command"
