"""Creating manifests through a Kubernetes API with discovery, as `kubectl create` does (I/O only)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Iterator
from typing import Any

import aiohttp
import yaml


def load_documents(paths: Iterable[pathlib.Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield document


async def _collection_url(session: aiohttp.ClientSession, document: dict[str, Any], namespace: str) -> str:
    api_version, kind = document["apiVersion"], document["kind"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    async with session.get(base) as response:
        response.raise_for_status()
        discovery = await response.json()
    for entry in discovery["resources"]:
        if entry["kind"] == kind and "/" not in entry["name"]:
            scope = f"/namespaces/{document['metadata'].get('namespace') or namespace}" if entry["namespaced"] else ""
            return f"{base}{scope}/{entry['name']}"
    raise LookupError(f"the API serves no {kind} in {api_version}")


async def create_all(server_url: str, documents: Iterable[dict[str, Any]], namespace: str = "default") -> list[str]:
    """Create each document in order; returns `kind/name` of each. An existing object is an error."""
    created = []
    async with aiohttp.ClientSession(server_url) as session:
        for document in documents:
            url = await _collection_url(session, document, namespace)
            async with session.post(url, json=document) as response:
                if response.status >= 400:
                    raise RuntimeError(
                        f"creating {document['kind']}/{document['metadata']['name']}: "
                        f"HTTP {response.status}: {(await response.json()).get('message')}"
                    )
            created.append(f"{document['kind']}/{document['metadata']['name']}")
    return created
