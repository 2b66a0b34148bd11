"""The documentation: docs/ builds with MkDocs in strict mode (a broken link or anchor fails it), README.md stays a
short front door whose feature table is docs/index.md's, and the command line's reference names every option."""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import unicodedata
from collections.abc import Iterator

import pytest

from celery_event_operator import cli
from tests.conftest import REPO

README_MAX_LINES = 200


def build(root: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The documentation built once for the module's tests, in strict mode."""
    built = tmp_path_factory.mktemp("docs") / "site"
    result = build(REPO, built)
    assert result.returncode == 0, result.stdout + result.stderr
    return built


def test_the_site_builds_in_strict_mode(site: pathlib.Path) -> None:
    assert (site / "reference" / "crds" / "index.html").exists()


@pytest.mark.parametrize(
    "link",
    [
        pytest.param("[a](operating/security.md#no-such-section)", id="anchor"),
        pytest.param("[a](operating/no-such-page.md)", id="page"),
        pytest.param("[a](../bench/README.md)", id="outside-docs"),
    ],
)
def test_a_broken_link_fails_the_build(tmp_path: pathlib.Path, link: str) -> None:
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a") as index:
        index.write(f"\nSee {link}.\n")
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Aborted with 1 warnings in strict mode" in result.stdout + result.stderr


def _page_of(link: str, site: pathlib.Path) -> pathlib.Path:
    """The built page of a link into docs/ (MkDocs' directory URLs: a/b.md is a/b/index.html)."""
    page = pathlib.PurePosixPath(link).relative_to("docs")
    if page.stem != "index":
        page = page.with_suffix("") / "index.md"
    return site / page.with_suffix(".html")


def _slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc (and so MkDocs) makes it."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def _ids(link: str, site: pathlib.Path) -> set[str]:
    """The anchors a link's target offers: the ids of its built page, or the headings of a Markdown file outside
    docs/ as GitHub and MkDocs' toc name them."""
    if link.startswith("docs/"):
        return set(re.findall(r'\bid="([^"]+)"', _page_of(link, site).read_text()))
    headings = re.findall(r"^#+\s+(.+?)\s*$", (REPO / link).read_text(), re.M)
    return {_slug(heading) for heading in headings}


def test_the_readme_is_a_front_door(site: pathlib.Path) -> None:
    """It starts with the two commands, stays short and links into docs/ (every link resolves to a file, and every
    #anchor to an id of the built page)."""
    readme = (REPO / "README.md").read_text()
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert readme.startswith("# celery-event-operator\n\n```sh\n./dev up ")
    assert "./dev test " in first_block
    assert len(readme.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#([^)]*))?\)", readme)
    assert any(link.startswith("docs/") for link, _ in links)
    assert [link for link, _ in links if not (REPO / link).exists()] == []
    anchored = [(link, anchor) for link, anchor in links if anchor]
    assert anchored, "the README links some sections"
    assert [f"{link}#{anchor}" for link, anchor in anchored if anchor not in _ids(link, site)] == []


def test_an_anchor_is_checked_against_the_ids_of_its_target(site: pathlib.Path) -> None:
    assert "rabbitmq-versions" in _ids("docs/getting-started/compatibility.md", site)
    assert "no-such-section" not in _ids("docs/getting-started/compatibility.md", site)
    assert "tests-and-ci" in _ids("docs/development.md", site)
    assert "fuzzing" in _ids("bench/README.md", site)


def _feature_table(text: str) -> str:
    return text.split("## What it does\n", 1)[1].split("\n\n## ", 1)[0].strip()


def test_the_readme_and_the_index_show_the_same_features() -> None:
    readme = _feature_table((REPO / "README.md").read_text()).replace("](docs/", "](")
    assert readme == _feature_table((REPO / "docs" / "index.md").read_text())


def _options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        else:
            for option in action.option_strings:
                if option not in ("-h", "--help", "--version"):
                    yield path, option


def test_the_command_line_reference_names_every_option() -> None:
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    missing = [f"{path} {option}" for path, option in _options(cli.build_parser(), "") if f"`{option}`" not in page]
    assert missing == []
