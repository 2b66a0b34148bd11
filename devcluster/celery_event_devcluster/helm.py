"""The real Helm binary, built from the Go module proxy (helm.sh/helm/v4, pinned in devcluster/helm/go.mod) by
devcluster/helm/build.sh into a cache outside the checkout: what the tests install, upgrade and uninstall the chart
with (`lookup` included, which rendering offline cannot do)."""

from __future__ import annotations

import pathlib
import subprocess

BUILD_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "helm" / "build.sh"


def build() -> pathlib.Path:
    """The helm binary, built first when the cache has none of this go.mod/go.sum (cold ~4-8 min on 2 cores)."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return pathlib.Path(done.stdout.strip().splitlines()[-1])
