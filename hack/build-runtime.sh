#!/usr/bin/env bash
# Builds what a real node runs besides its kubelet: containerd (with its runc shim and ctr),
# runc, crictl and the reference CNI plugins, from the published Go modules pinned in
# hack/runtime/go.mod, and the pause image's binary from Kubernetes' pause.c (a static gcc
# build, from the module of hack/controlplane). The kubelet is built with the control plane
# (hack/build-controlplane.sh). Binaries go to a cache directory keyed by the pins, so a
# machine builds them once. Prints the directory holding the binaries as its last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$here/runtime"
tag=runtime
# shellcheck source=hack/lib.sh
. "$here/lib.sh"
require_go "containerd 2.4"
command -v gcc >/dev/null 2>&1 || fail "find gcc" "runc and pause need a C compiler: apt-get install gcc libc6-dev"
# runc filters system calls with libseccomp (containerd runs every pod sandbox under the
# runtime's default seccomp profile).
if [ ! -e /usr/include/seccomp.h ]; then
  step "installing libseccomp-dev (Debian package) for runc"
  { apt-get update -qq && apt-get install -y -qq libseccomp-dev >/dev/null; } \
    || fail "install libseccomp-dev" "runc needs libseccomp-dev: apt-get install libseccomp-dev"
fi

key=$( (cat "$mod/go.mod" "$mod/go.sum" "$here/controlplane/go.mod" "$0") | sha256sum | cut -c1-12)
out="$cache_root/runtime/$key"
link_current() { ln -sfn "$key" "$cache_root/runtime/current"; }
binaries=(containerd containerd-shim-runc-v2 ctr runc crictl bridge host-local loopback portmap pause)

missing=()
for b in "${binaries[@]}"; do [ -x "$out/bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  link_current
  step "cached in $out/bin"
  echo "$out/bin"
  exit 0
fi

export GOSUMDB=off GOFLAGS="-mod=readonly -buildvcs=false"
cd "$mod"
declare -A pkgs=(
  [containerd]=github.com/containerd/containerd/v2/cmd/containerd
  [containerd-shim-runc-v2]=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  [ctr]=github.com/containerd/containerd/v2/cmd/ctr
  [runc]=github.com/opencontainers/runc
  [crictl]=sigs.k8s.io/cri-tools/cmd/crictl
  [bridge]=github.com/containernetworking/plugins/plugins/main/bridge
  [host-local]=github.com/containernetworking/plugins/plugins/ipam/host-local
  [loopback]=github.com/containernetworking/plugins/plugins/main/loopback
  [portmap]=github.com/containernetworking/plugins/plugins/meta/portmap
)
# Version stamps, as each project's Makefile sets them.
declare -A stamps=(
  [containerd]="-X github.com/containerd/containerd/v2/version.Version=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)"
  [runc]="-X main.version=$(go list -m -f '{{.Version}}' github.com/opencontainers/runc | sed 's/^v//')"
  [crictl]="-X sigs.k8s.io/cri-tools/pkg/version.Version=$(go list -m -f '{{.Version}}' sigs.k8s.io/cri-tools)"
)
stamps[containerd-shim-runc-v2]=${stamps[containerd]}
stamps[ctr]=${stamps[containerd]}

start=$SECONDS
total=$((${#binaries[@]} + 1))
step "building ${missing[*]} into $out/bin ($go_version, $(nproc) cores; a cold build takes several minutes)"
step "1/$total downloading Go modules"
go mod download || fail "download modules" "could not fetch the modules in hack/runtime/go.mod from the Go module proxy ($(go env GOPROXY))"
go mod verify >/dev/null || fail "download modules" "module checksums do not match hack/runtime/go.sum"
mkdir -p "$out/bin"
n=1
for b in "${binaries[@]}"; do
  n=$((n + 1))
  if [ -x "$out/bin/$b" ]; then step "$n/$total $b: cached"; continue; fi
  t=$SECONDS
  if [ "$b" = pause ]; then
    # The pause container's process, as Kubernetes builds it (build/pause/Makefile).
    pause_c=$(cd "$here/controlplane" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
    step "$n/$total compiling pause ($pause_c)"
    gcc -Os -Wall -Werror -static -DVERSION=v3.10-nicop -o "$out/bin/pause.tmp" "$pause_c" \
      || fail "compile pause" "gcc -static $pause_c failed (is libc6-dev installed?)"
  else
    step "$n/$total compiling $b (${pkgs[$b]})"
    # runc needs cgo (its nsenter is C) and libseccomp (the seccomp tag).
    cgo=0
    tags="no_btrfs no_devmapper no_zfs"
    [ "$b" = runc ] && cgo=1 && tags="seccomp"
    CGO_ENABLED=$cgo go build -trimpath -tags "$tags" -ldflags "-s -w ${stamps[$b]:-}" \
      -o "$out/bin/$b.tmp" "${pkgs[$b]}" \
      || fail "compile $b" "go build ${pkgs[$b]} failed (see the compiler output above)"
  fi
  mv "$out/bin/$b.tmp" "$out/bin/$b"
  step "$n/$total $b done in $((SECONDS - t))s"
done
link_current
step "built in $((SECONDS - start))s, $(du -sh "$out/bin" | cut -f1) on disk"
echo "$out/bin"
