#!/usr/bin/env bash
# Build the cdigen image without pulling a base image: Debian's packages make the root
# (mmdebstrap), podman imports it as localhost/cdigen-base:bookworm, and Containerfile installs
# cdigen and its dependencies from wheels built here first (pip wheel, while mmdebstrap runs;
# pip's cache makes reruns fast). Needs root, mmdebstrap, podman and runc (apt-get install
# mmdebstrap podman runc). About 40 s of CPU for the root, 20 s for the wheels, 30 s to build.
#
#   deploy/image/build.sh [TAG]   (default TAG: localhost/cdigen:v<version from pyproject.toml>,
#                                  the name the manifests in deploy/ use: deploy/image/images.txt)
#
# The image's OCI labels: org.opencontainers.image.version (pyproject.toml),
# .revision (the checkout's commit, "-dirty" after it when files differ from it) and .source
# (SOURCE, default the checkout's origin remote; "unknown" without one).
#
# Environment: PODMAN (default "podman"; e.g. "podman --root DIR --runroot DIR --storage-driver
# vfs" for a private store), PYTHON (default python3, used for `pip wheel`), SUITE (default
# bookworm: its python3 is 3.11, the Python the wheels are built for), MIRROR (default: Debian's).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)"
tag="${1:-localhost/cdigen:v$version}"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && [ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
source_url="${SOURCE:-$(git -C "$repo" remote get-url origin 2>/dev/null || echo unknown)}"
podman_cmd=(${PODMAN:-podman})
python="${PYTHON:-python3}"
suite="${SUITE:-bookworm}"
# python3, and libstdc++ for grpcio's compiled core; the tag names the package set, so a change
# to it makes a new base.
packages="python3,libstdc++6"
base="localhost/cdigen-base:$suite-$(printf %s "$packages" | sha256sum | cut -c1-8)"
work="$(mktemp -d "${TMPDIR:-/tmp}/cdigen-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT

say() { printf 'build.sh: %s\n' "$*" >&2; }
for tool in mmdebstrap "${podman_cmd[0]}"; do
  command -v "$tool" >/dev/null || { say "$tool is not installed (apt-get install mmdebstrap podman runc)"; exit 2; }
done

start=$(date +%s)
# The wheels build in the background while mmdebstrap makes the root (two cores: half the time).
mkdir -p "$work/context/wheels"
"$python" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$work/context/wheels" \
  "$repo" pip >"$work/pip.log" 2>&1 &
wheels=$!
if ! "${podman_cmd[@]}" image exists "$base"; then
  say "making the $suite root with mmdebstrap"
  # Debian's essential set and $packages; no apt, no docs, no caches; dpkg without fsync (the
  # root is thrown away if the build fails; the image has no dpkg runs after it).
  mmdebstrap --quiet --variant=essential --include="$packages" --dpkgopt=force-unsafe-io \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    "$suite" "$work/root" ${MIRROR:+"$MIRROR"}
  tar -C "$work/root" -c . | "${podman_cmd[@]}" import --quiet - "$base" >/dev/null
  rm -rf "$work/root"
fi
say "base ready after $(( $(date +%s) - start )) s; waiting for the wheels"
if ! wait "$wheels"; then
  cat "$work/pip.log" >&2
  say "pip wheel failed (see above)"
  exit 1
fi
cp "$repo/deploy/image/Containerfile" "$work/context/Containerfile"
say "wheels ready after $(( $(date +%s) - start )) s; building $tag"
# --layers=false: one container for the whole build and one commit at the end (no intermediate
# image per instruction, which on the vfs storage driver is a full copy of the root each).
"${podman_cmd[@]}" build --quiet --layers=false --network none --build-arg "BASE=$base" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "SOURCE=$source_url" \
  -t "$tag" "$work/context" >/dev/null
say "built $tag in $(( $(date +%s) - start )) s"
