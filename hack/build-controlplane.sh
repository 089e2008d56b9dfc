#!/usr/bin/env bash
# Builds the real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok, kubectl to look at it, and the kubelet of a real node) from the
# published Go modules pinned in hack/controlplane/go.mod.
# Binaries go to a cache directory keyed by the pins, so a machine builds them once.
# Prints the directory holding the binaries as its last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$here/controlplane"
tag=controlplane
# shellcheck source=hack/lib.sh
. "$here/lib.sh"
require_go "Kubernetes 1.36"

key=$(cache_key "$mod")
out="$cache_root/controlplane/$key"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl kubelet)

missing=()
for b in "${binaries[@]}"; do [ -x "$out/bin/$b" ] || missing+=("$b"); done
# `nicop cluster up` finds the binaries of the last build through this link.
link_current() { ln -sfn "$key" "$cache_root/controlplane/current"; }

if [ ${#missing[@]} -eq 0 ]; then
  link_current
  step "cached in $out/bin"
  echo "$out/bin"
  exit 0
fi

export GOSUMDB=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
cd "$mod"
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$k8s_version" | cut -d. -f2)
stamp="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean"
done

start=$SECONDS
total=$((${#binaries[@]} + 1))
step "building ${missing[*]} into $out/bin ($go_version, $(nproc) cores; a cold build takes many minutes)"
step "1/$total downloading Go modules"
go mod download || fail "download modules" "could not fetch the modules in hack/controlplane/go.mod from the Go module proxy ($(go env GOPROXY))"
go mod verify >/dev/null || fail "download modules" "module checksums do not match hack/controlplane/go.sum"
mkdir -p "$out/bin"
declare -A pkgs=(
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kwok]=sigs.k8s.io/kwok/cmd/kwok
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
)
n=1
for b in "${binaries[@]}"; do
  n=$((n + 1))
  if [ -x "$out/bin/$b" ]; then step "$n/$total $b: cached"; continue; fi
  t=$SECONDS
  step "$n/$total compiling $b (${pkgs[$b]})"
  go build -trimpath -ldflags "$stamp" -o "$out/bin/$b.tmp" "${pkgs[$b]}" \
    || fail "compile $b" "go build ${pkgs[$b]} failed (see the compiler output above)"
  mv "$out/bin/$b.tmp" "$out/bin/$b"
  step "$n/$total $b done in $((SECONDS - t))s"
done
link_current
step "built in $((SECONDS - start))s, $(du -sh "$out/bin" | cut -f1) on disk"
echo "$out/bin"
