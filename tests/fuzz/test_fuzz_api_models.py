"""Resources as users write them (the examples, mutated: fields replaced by any JSON, removed, added): the operator's
models accept what the API server admits by the CRD (as the API server stores it: emulated offline,
tests/support/crd_validation.py), and refuse what it refuses (for a cluster where the CRD's schema was not enforced), as
InvalidSpec with a message that carries none of the spec's values."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from celery_event_operator.core.api import crd
from celery_event_operator.core.api.models import parse_replay_spec, parse_spec
from celery_event_operator.core.errors import InvalidSpecError
from tests.conftest import load_examples
from tests.support.crd_validation import admit, stored

PARSERS = {"CeleryEventService": parse_spec, "CeleryEventReplay": parse_replay_spec}
CRDS = {kind.kind: crd.custom_resource_definition(kind) for kind in crd.KINDS}
EXAMPLES = [document for _, document in load_examples() if document["kind"] in PARSERS]
SENTINEL = "Zq7"  # in every generated text: found in a message, it is a value that leaked
# What a spec can hold once the API server decoded it: JSON, its numbers int64 or finite doubles.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12).map(f"{SENTINEL}{{}}".format),
    st.sampled_from(["round-robin", "quorum", "classic", "delete", "retain", "replay", "purge", "0", "a.b"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)


def places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside `value` (dict keys and list indices)."""
    found = [path]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += places(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += places(inner, (*path, index))
    return found


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    document = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(places(document["spec"])))
        parent: Any = document["spec"]
        for part in path[:-1]:
            parent = parent[part]
        value = draw(VALUES)
        if not path:
            document["spec"] = value
        elif draw(st.booleans()):
            parent[path[-1]] = value
        elif isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.append(value)
        if isinstance(document["spec"], dict) and draw(st.booleans()):
            document["spec"][draw(st.sampled_from(["retries", "broker", "action", "serviceRef", "x"]))] = draw(VALUES)
    return document


@given(document=resources())
def test_the_models_accept_what_the_api_server_admits_and_refuse_the_rest_without_its_values(
    document: dict[str, Any],
) -> None:
    parse = PARSERS[document["kind"]]
    definition = CRDS[document["kind"]]
    violations = admit(definition, document)
    try:
        parse((stored(definition, document) if not violations else document)["spec"])
    except InvalidSpecError as exc:
        refusal: str | None = str(exc)
    else:
        refusal = None
    assert SENTINEL not in (refusal or "")
    assert (refusal is None) == (not violations), (refusal, violations)
