#!/usr/bin/env bash
# Builds nicop's container image without a registry or a container engine: a Debian bookworm
# root filesystem (mmdebstrap, minbase) with python3 and what the agents run (kmod for the
# driver agent, mstflint for the SR-IOV config daemon's link type), nicop and its dependencies
# installed from wheels into a virtualenv at /opt/nicop, packed as an OCI image by umoci.
#
# The image holds the `nicop` distribution only (operator, agents, CLI), not the simulation.
# It goes to a cache directory keyed by the sources that make it (src/nicop, pyproject.toml,
# this script), so an unchanged tree "rebuilds" in seconds, and a changed src/nicop in about 15 s
# (the root filesystem with the dependencies is kept per pyproject.toml and this script); the same
# tree gives the same image (SOURCE_DATE_EPOCH fixes every timestamp, the package versions come
# from one snapshot). Only the newest image and base are kept.
#
# Output: an OCI archive nicop-<version>.oci.tar (ref name = version), importable with
#   ctr -n k8s.io images import --base-name docker.io/library/nicop nicop-<version>.oci.tar
# Prints the path of the archive as its last line. Needs root (mmdebstrap's chroot).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
tag=image
# shellcheck source=hack/lib.sh
. "$here/lib.sh"

[ "$(id -u)" = 0 ] || fail "check root" "building the root filesystem needs root (mmdebstrap chroots into it)"
python=${PYTHON:-$top/.venv/bin/python}
[ -x "$python" ] || python=python3
version=$("$python" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$top/pyproject.toml")
key=$( (cd "$top" && cat "$0" pyproject.toml && find src/nicop -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-12)
out="$cache_root/image/$key"
archive="$out/nicop-$version.oci.tar"
link_current() { ln -sfn "$key" "$cache_root/image/current"; }

if [ -s "$archive" ]; then
  link_current
  step "cached: $archive ($(du -h "$archive" | cut -f1))"
  echo "$archive"
  exit 0
fi

need=()
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v umoci >/dev/null 2>&1 || need+=(umoci)
if [ ${#need[@]} -gt 0 ]; then
  step "installing ${need[*]} (Debian packages)"
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null \
    || fail "install tools" "apt-get install ${need[*]} failed"
fi

start=$SECONDS
unset PIP_FIND_LINKS  # the image gets the wheels given here, nothing else
work=$(mktemp -d "${TMPDIR:-/tmp}/nicop-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1767225600}  # 2026-01-01

# The root filesystem with python3, the tools and nicop's dependencies changes only with this
# script and pyproject.toml: built once (about half a minute) and kept; a source change then only
# installs nicop's own wheel into a copy of it.
base_key=$( (cd "$top" && cat "$0" pyproject.toml) | sha256sum | cut -c1-12)
base="$cache_root/image-base/$base_key"

step "1/4 wheel: nicop $version"
# From a copy: setuptools leaves a build/ directory in the tree it builds.
mkdir -p "$work/source"
cp -r "$top/src" "$top/pyproject.toml" "$top/README.md" "$work/source/"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheels" "$work/source" \
  || fail "build wheel" "pip wheel of $top failed"

if [ ! -d "$base/rootfs" ]; then
  step "2/4 base root filesystem (once per pyproject.toml): Debian bookworm minbase + python3, kmod, mstflint; nicop's dependencies in /opt/nicop"
  "$python" -m pip download --quiet --only-binary=:all: --python-version 3.11 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --dest "$work/deps" "$work"/wheels/nicop-*.whl \
    || fail "download wheels" "pip download of nicop's dependencies failed (is PyPI reachable?)"
  rm -rf "$base.tmp" && mkdir -p "$base.tmp"
  mmdebstrap --quiet --variant=minbase --mode=root --format=directory \
    --include=python3,python3-venv,kmod,mstflint \
    --customize-hook='mkdir -p "$1/tmp/wheels"' \
    --customize-hook="copy-in $work/deps/. /tmp/wheels" \
    --customize-hook='chroot "$1" python3 -m venv /opt/nicop' \
    --customize-hook='chroot "$1" /opt/nicop/bin/pip install --quiet --no-index --no-compile --find-links /tmp/wheels nicop' \
    --customize-hook='chroot "$1" /opt/nicop/bin/pip uninstall --quiet --yes nicop' \
    --customize-hook='chroot "$1" /opt/nicop/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/nicop/lib' \
    --customize-hook='rm -rf "$1/tmp/wheels"' \
    --customize-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/locale/* "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    bookworm "$base.tmp/rootfs" http://deb.debian.org/debian \
    || fail "root filesystem" "mmdebstrap failed (is deb.debian.org reachable?)"
  rm -rf "$base" && mv "$base.tmp" "$base"
  find "$cache_root/image-base" -mindepth 1 -maxdepth 1 ! -name "$base_key" -exec rm -rf {} +
else
  step "2/4 base root filesystem: cached in $base"
fi

step "2/4 nicop in /opt/nicop"
cp -a "$base/rootfs" "$work/rootfs"
cp "$work"/wheels/nicop-*.whl "$work/rootfs/tmp/"
chroot "$work/rootfs" /opt/nicop/bin/pip install --quiet --no-index --no-deps --no-compile /tmp/"$(basename "$work"/wheels/nicop-*.whl)" \
  || fail "install nicop" "pip install of nicop's wheel into the image failed"
chroot "$work/rootfs" /opt/nicop/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/nicop/lib/python3.11/site-packages/nicop \
  || fail "compile nicop" "compileall in the image failed"
chroot "$work/rootfs" /opt/nicop/bin/pip uninstall --quiet --yes setuptools pip
rm -rf "$work"/rootfs/tmp/* "$work"/rootfs/root/.cache
# The same tree gives the same image: every file's time is SOURCE_DATE_EPOCH's.
find "$work/rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

step "3/4 OCI image (umoci)"
umoci init --layout "$work/oci" >/dev/null
umoci new --image "$work/oci:$version" >/dev/null
umoci unpack --image "$work/oci:$version" "$work/bundle" >/dev/null
rm -rf "$work/bundle/rootfs"
mv "$work/rootfs" "$work/bundle/rootfs"
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
umoci repack --refresh-bundle --history.created "$created" --history.created_by "hack/build-image.sh" --image "$work/oci:$version" "$work/bundle" >/dev/null
umoci config --image "$work/oci:$version" --no-history --created "$created" \
  --config.entrypoint nicop --config.cmd --help --config.workingdir / \
  --config.env PATH=/opt/nicop/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env PYTHONUNBUFFERED=1 --config.env PYTHONDONTWRITEBYTECODE=1 \
  --clear=config.labels --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.title=nicop" >/dev/null
umoci gc --layout "$work/oci"

step "4/4 archive"
mkdir -p "$out"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$work/oci" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"
link_current
# Only the image of the tree as it is now is kept (each is ~90 MB).
find "$cache_root/image" -mindepth 1 -maxdepth 1 ! -name "$key" ! -name current -exec rm -rf {} +
step "built in $((SECONDS - start))s: $archive, $(du -h "$archive" | cut -f1) (layers are gzip-compressed)"
echo "$archive"
