"""JSON Patch (RFC 6902) and JSON Merge Patch (RFC 7386) over plain JSON values (pure).

Only what the emulated API needs; written here rather than pulled in as a dependency because the
semantics the API server relies on (a failed `test` is a 422, not a crash) must be exact.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """The patch cannot be applied; the API answers 422."""


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"invalid JSON pointer {pointer!r}")
    return [token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")]


def _index(container: list[Any], token: str, *, for_insert: bool) -> int:
    if for_insert and token == "-":
        return len(container)
    if not token.isdigit():
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not for_insert):
        raise PatchError(f"array index {index} out of range")
    return index


def _parent(document: Any, tokens: list[str]) -> Any:
    node = document
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"path element {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_insert=False)]
        else:
            raise PatchError(f"path element {token!r} is not a container")
    return node


def _get(document: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return document
    parent = _parent(document, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path {pointer!r} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_insert=False)]
    raise PatchError(f"path {pointer!r} does not exist")


def _add(document: Any, pointer: str, value: Any) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return value
    parent = _parent(document, tokens)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, tokens[-1], for_insert=True), value)
    else:
        raise PatchError(f"cannot add at {pointer!r}")
    return document


def _remove(document: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        raise PatchError("cannot remove the whole document")
    _get(document, pointer)  # must exist
    parent = _parent(document, tokens)
    if isinstance(parent, dict):
        del parent[tokens[-1]]
    else:
        del parent[_index(parent, tokens[-1], for_insert=False)]
    return document


def apply(document: Any, operations: Any) -> Any:
    """RFC 6902, all-or-nothing: the input is never modified."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    result = copy.deepcopy(document)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise PatchError(f"malformed operation {operation!r}")
        op, path = operation["op"], operation["path"]
        if op in ("add", "replace", "test") and "value" not in operation:
            raise PatchError(f"operation {op!r} at {path!r} needs a value")
        if op == "add":
            result = _add(result, path, copy.deepcopy(operation["value"]))
        elif op == "remove":
            result = _remove(result, path)
        elif op == "replace":
            _get(result, path)
            result = (
                _add(_remove(result, path), path, copy.deepcopy(operation["value"]))
                if path
                else copy.deepcopy(operation["value"])
            )
        elif op in ("move", "copy"):
            value = copy.deepcopy(_get(result, operation.get("from", "")))
            if op == "move":
                result = _remove(result, operation.get("from", ""))
            result = _add(result, path, value)
        elif op == "test":
            if _get(result, path) != operation["value"]:
                raise PatchError(f"test failed at {path!r}")
        else:
            raise PatchError(f"unknown operation {op!r}")
    return result
