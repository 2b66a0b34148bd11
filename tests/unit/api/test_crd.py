"""The CRD rendered from the models: structural, complete, and identical to the committed one."""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from celery_event_operator import cli
from celery_event_operator.core.api import crd, crd_reference, models

REPO = pathlib.Path(__file__).resolve().parents[3]


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    nodes = [(path, node)]
    for name, child in node.get("properties", {}).items():
        nodes += _walk(child, f"{path}.{name}")
    if "items" in node:
        nodes += _walk(node["items"], f"{path}[]")
    return nodes


@pytest.mark.parametrize("kind", crd.KINDS, ids=[kind.kind for kind in crd.KINDS])
@pytest.mark.parametrize("directory", cli.CRD_OUTPUT_DIRS)
def test_committed_crd_matches_the_models(directory: str, kind: crd.Kind) -> None:
    committed = (REPO / directory / kind.file_name).read_text()
    assert committed == crd.render_yaml(kind), f"{directory} is stale: run `celery-event-operator crd`"


def test_crd_check_fails_when_a_model_changed_without_rendering(tmp_path: pathlib.Path) -> None:
    stale = crd.render_yaml().replace("maximum: 20", "maximum: 30")
    (tmp_path / crd.CRD_FILE_NAME).write_text(stale)
    assert cli.main(["crd", "--check", "--output-dir", str(tmp_path)]) == 1
    assert cli.main(["crd", "--output-dir", str(tmp_path)]) == 0
    assert cli.main(["crd", "--check", "--output-dir", str(tmp_path)]) == 0


def test_committed_reference_matches_the_models() -> None:
    """docs/reference/crds.md is generated as crds/ is: every field, from the same schema."""
    committed = (REPO / cli.CRD_REFERENCE_FILE).read_text()
    assert committed == crd_reference.render_markdown(), "the CRD reference is stale: run `celery-event-operator crd`"


def test_crd_check_fails_when_the_reference_is_stale(tmp_path: pathlib.Path) -> None:
    reference = tmp_path / "crds.md"
    args = ["--output-dir", str(tmp_path), "--reference-file", str(reference)]
    assert cli.main(["crd", *args]) == 0
    reference.write_text(reference.read_text().replace("| 0 to 20 |", "| 0 to 30 |"))
    assert cli.main(["crd", "--check", *args]) == 1
    assert cli.main(["crd", *args]) == 0
    assert cli.main(["crd", "--check", *args]) == 0


def test_crd_check_without_output_dir_compares_the_default_reference(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`crd --check` alone (what a developer and CI run from the checkout) checks crds/, the chart's copy and
    docs/reference/crds.md: a copy of the committed files passes, and a stale reference in it fails."""
    assert cli.CRD_REFERENCE_FILE == "docs/reference/crds.md"
    for relative in [
        *(f"{d}/{kind.file_name}" for d in cli.CRD_OUTPUT_DIRS for kind in crd.KINDS),
        cli.CRD_REFERENCE_FILE,
    ]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text((REPO / relative).read_text())
    monkeypatch.chdir(tmp_path)
    assert cli.main(["crd", "--check"]) == 0
    reference = tmp_path / cli.CRD_REFERENCE_FILE
    reference.write_text(reference.read_text().replace("| 0 to 20 |", "| 0 to 30 |"))
    capsys.readouterr()
    assert cli.main(["crd", "--check"]) == 1
    assert cli.CRD_REFERENCE_FILE in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "keyword"),
    [
        pytest.param({"type": "object", "additionalProperties": {"type": "string"}}, "additionalProperties", id="map"),
        pytest.param({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "anyOf", id="anyOf"),
        pytest.param({"type": "integer", "x-kubernetes-int-or-string": True}, "x-kubernetes-int-or-string", id="ext"),
        pytest.param({"type": "array", "items": {"type": "array", "items": {"type": "string"}}}, "items", id="nested"),
        pytest.param({"type": "array", "items": {"type": "string", "uniqueItems": True}}, "uniqueItems", id="item"),
    ],
)
def test_the_reference_refuses_a_schema_keyword_it_does_not_render(field: dict[str, Any], keyword: str) -> None:
    """Left out silently, a keyword would be a rule of the API server the page does not say."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "odd": field}}
    with pytest.raises(crd_reference.UnrenderedSchemaError, match=keyword) as raised:
        crd_reference.field_table("spec", schema)
    assert "spec.odd" in str(raised.value)


def test_the_reference_says_the_constraints_of_a_list_s_items() -> None:
    page = crd_reference.render_markdown()
    assert (
        "| `spec.filter.taskIds` | array of string | `[]` | at most 1000 items; each item 1 to 255 characters |" in page
    )


def test_the_reference_lists_every_field_with_its_constraints() -> None:
    page = crd_reference.render_markdown()
    for kind in crd.KINDS:
        assert f"## {kind.kind}" in page
        for path, _node in _walk(crd.open_api_schema(kind)):
            if path.startswith((".spec", ".status")) and not path.endswith("[]"):
                assert f"| `{path[1:]}` |" in page, f"{path} is missing"
    assert "| `spec.retry.maxRetries` | integer | `10` | 0 to 20 |" in page
    assert "one of `classic`, `quorum`" in page
    assert "queueType is immutable — `self.queueType == oldSelf.queueType`" in page
    assert '| Reason | string | `.status.conditions[?(@.type=="Ready")].reason` | `-o wide` |' in page


@pytest.mark.parametrize("kind", crd.KINDS, ids=[kind.kind for kind in crd.KINDS])
def test_schema_is_structural(kind: crd.Kind) -> None:
    schema = crd.open_api_schema(kind)
    for path, node in _walk(schema):
        assert "type" in node, f"{path or '<root>'} has no type"
        forbidden = {"$ref", "anyOf", "oneOf", "allOf", "nullable", "title", "$defs"} & set(node)
        assert not forbidden, f"{path} carries {forbidden}"
        assert "null" not in str(node.get("default")).lower(), f"{path} defaults to a null"


@pytest.mark.parametrize(
    ("path", "keyword", "value"),
    [
        pytest.param(".spec.retry.maxRetries", "maximum", models.MAX_RETRIES_CAP, id="retry-cap"),
        pytest.param(".spec.retry.maxRetries", "default", 10, id="retry-default-as-celery-amqp-events"),
        pytest.param(".spec.archive.messageTTLSeconds", "default", 604800, id="archive-ttl-7-days"),
        pytest.param(".spec.archive.maxLength", "default", 10000, id="archive-length"),
        pytest.param(".spec.queueType", "enum", ["classic", "quorum"], id="queue-types"),
        pytest.param(".spec.serviceName", "pattern", models.SERVICE_NAME_PATTERN, id="service-name-pattern"),
        pytest.param(".spec.events.handlers[].name", "pattern", models.EVENT_NAME_PATTERN, id="event-name-pattern"),
        pytest.param(".spec.events.handlers", "x-kubernetes-list-type", "map", id="handlers-keyed-by-name"),
    ],
)
def test_schema_carries_constraints(path: str, keyword: str, value: Any) -> None:
    nodes = dict(_walk(crd.open_api_schema()))
    assert nodes[path][keyword] == value


def test_crd_identity_subresources_and_columns() -> None:
    body = crd.custom_resource_definition()
    spec = body["spec"]
    assert body["metadata"]["name"] == "celeryeventservices.celeryevents.io"
    assert spec["names"]["shortNames"] == ["ces", "celeryevents"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.workers.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    default_columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert default_columns == ["Ready", "Queue", "Consumers", "Replicas", "Age"]


@pytest.mark.parametrize("kind", crd.KINDS, ids=[kind.kind for kind in crd.KINDS])
def test_status_schema_has_no_phase_and_conditions_by_type(kind: crd.Kind) -> None:
    status = crd.open_api_schema(kind)["properties"]["status"]
    assert "phase" not in status["properties"]
    assert status["properties"]["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_replay_crd_identity_and_columns() -> None:
    body = crd.custom_resource_definition(crd.REPLAY)
    assert body["metadata"]["name"] == "celeryeventreplays.celeryevents.io"
    assert body["spec"]["names"]["shortNames"] == ["cer"]
    version = body["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    default_columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert default_columns == ["Service", "Action", "Succeeded", "Reason", "Matched", "Replayed", "Remaining", "Age"]
    nodes = dict(_walk(crd.open_api_schema(crd.REPLAY)))
    assert nodes[".status.preview"]["maxItems"] == models.PREVIEW_SIZE, "what status lists is bounded"
    assert nodes[".spec.filter.taskIds"]["maxItems"] == models.MAX_FILTER_TASK_IDS


def test_the_command_line_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #16: a one-line top-level help, no --version, options without help or defaults."""
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.startswith("celery-event-operator 0.")
    parser = cli.build_parser()
    top = parser.format_help()
    for command in ("run", "dev", "topology", "archive", "crd"):
        assert f"    {command} " in top, f"{command} is listed with its line"

    def options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action, str]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from options(sub, f"{path} {name}")
            elif action.dest != "help":
                yield path, action, parser.format_help()

    for path, action, text in options(parser, "celery-event-operator"):
        assert action.help, f"{path} {action.option_strings} has no help"
        shown = action.default not in (None, False, [], argparse.SUPPRESS)
        if action.option_strings and shown and "default" not in action.help:
            assert f"(default: {action.default})" in " ".join(text.split()), f"{path} {action.option_strings}"
