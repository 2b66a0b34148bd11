"""The operator's wheel, built from what the Dockerfile copies into its build stage, carries no dev cluster and
no kmock (the dev cluster is its own distribution, devcluster/)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

from tests.conftest import REPO


def build_context() -> list[str]:
    """The paths the Dockerfile's build stage copies from the repository (`COPY src... dest`, not `--from`)."""
    copied: list[str] = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(word.startswith("--from") for word in words):
            copied += words[1:-1]
    return copied


def test_the_operator_wheel_carries_no_dev_cluster_and_no_kmock(tmp_path: pathlib.Path) -> None:
    context = build_context()
    assert "operator" in context, context
    assert not any(path.startswith("devcluster") for path in context), context
    source = tmp_path / "source"
    for path in context:
        if (REPO / path).is_dir():
            shutil.copytree(REPO / path, source / path, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(REPO / path, source / path)
    built = subprocess.run(
        # Offline: the venv's own setuptools (the dev extra), no index.
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"),
            *("--wheel-dir", str(tmp_path / "dist"), str(source)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("celery_event_operator-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = (name for name in names if name.endswith(".dist-info/METADATA"))
        requirements = [
            line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")
        ]
    assert "celery_event_operator/cli.py" in names
    assert [name for name in names if "devcluster" in name] == []
    assert any("kopf" in line for line in requirements), requirements
    assert [line for line in requirements if "kmock" in line.lower()] == []
