#!/usr/bin/env bash
# Builds helm from its published Go module, pinned in hack/helm/go.mod, to render and test the
# chart in deploy/helm/nicop. The binary goes to a cache directory keyed by the pins, so a
# machine builds it once. Prints the path of the helm binary as its last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$here/helm"
tag=helm
# shellcheck source=hack/lib.sh
. "$here/lib.sh"
require_go "helm 3.22"

key=$(cache_key "$mod")
out="$cache_root/helm/$key"
link_current() { ln -sfn "$key" "$cache_root/helm/current"; }

if [ -x "$out/bin/helm" ]; then
  link_current
  step "cached in $out/bin"
  echo "$out/bin/helm"
  exit 0
fi

export GOSUMDB=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
cd "$mod"
start=$SECONDS
step "building helm into $out/bin ($go_version, $(nproc) cores; a cold build takes a few minutes)"
step "1/3 downloading Go modules"
go mod download || fail "download modules" "could not fetch the modules in hack/helm/go.mod from the Go module proxy ($(go env GOPROXY))"
go mod verify >/dev/null || fail "download modules" "module checksums do not match hack/helm/go.sum"
helm_version=$(go list -m -f '{{.Version}}' helm.sh/helm/v3) \
  || fail "read versions" "helm.sh/helm/v3 is not required by hack/helm/go.mod"
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/client-go) \
  || fail "read versions" "k8s.io/client-go is not in hack/helm/go.mod"
# As helm's Makefile does: the version `helm version` prints, and the Kubernetes version
# `helm template` assumes without a cluster (client-go v0.X.Y is Kubernetes 1.X).
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
stamp="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
stamp+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  stamp+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
mkdir -p "$out/bin"
t=$SECONDS
step "2/3 compiling helm $helm_version (helm.sh/helm/v3/cmd/helm)"
go build -trimpath -ldflags "$stamp" -o "$out/bin/helm.tmp" helm.sh/helm/v3/cmd/helm \
  || fail "compile helm" "go build helm.sh/helm/v3/cmd/helm failed (see the compiler output above)"
step "2/3 helm done in $((SECONDS - t))s"
step "3/3 checking the binary"
version=$("$out/bin/helm.tmp" version --template '{{.Version}}' 2>&1) \
  || fail "check helm" "the built binary does not run: $version"
[ "$version" = "$helm_version" ] \
  || fail "check helm" "the built binary says it is $version, expected $helm_version"
mv "$out/bin/helm.tmp" "$out/bin/helm"
link_current
step "built in $((SECONDS - start))s, $(du -sh "$out/bin" | cut -f1) on disk"
echo "$out/bin/helm"
