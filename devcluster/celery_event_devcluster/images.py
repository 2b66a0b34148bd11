"""The operator's image and the sample worker's, built from the repository's Dockerfiles without a registry or a
Docker engine by devcluster/images/build.sh (a Debian bookworm Python base from Debian's packages, `podman import`,
`buildah bud --isolation chroot --pull=never`), cached by content outside the checkout.

`python -m celery_event_devcluster.images` builds both (or finds them built) and prints `NAME REFERENCE ARCHIVE`
per image: the reference in podman's storage, and the archive (`podman save`) a node imports into containerd.
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

BUILD_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "images" / "build.sh"
# What the same container runtime needs here beyond its defaults: this machine's processes lack CAP_SYS_RESOURCE,
# so a container cannot be given podman's default limits, which pass the machine's hard limits.
PODMAN_ULIMITS = ("--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096")


@dataclasses.dataclass(frozen=True)
class Image:
    name: str  # operator, worker
    reference: str  # localhost/REPOSITORY:KEY
    archive: pathlib.Path  # docker-archive of the image

    @property
    def repository(self) -> str:
        return self.reference.rpartition(":")[0]

    @property
    def tag(self) -> str:
        return self.reference.rpartition(":")[2]


def build(*arguments: str) -> dict[str, Image]:
    """The images by name, built first when the cache has none of this content (cold ~3 min, needs root);
    `build("rabbitmq", VERSION)`: the broker of that version."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT), *arguments], check=True, stdout=subprocess.PIPE, text=True)
    images = {}
    for line in done.stdout.splitlines():
        name, reference, archive = line.split()
        images[name] = Image(name, reference, pathlib.Path(archive))
    return images


def main() -> int:
    for image in build().values():
        print(image.name, image.reference, image.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
