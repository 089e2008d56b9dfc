#!/usr/bin/env bash
# Builds promtool from Prometheus' published Go module, pinned in hack/promtool/go.mod, to check
# the alerting rules of the chart's PrometheusRule. The binary goes to a cache directory keyed by
# the pins, so a machine builds it once. Prints the path of the promtool binary as its last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mod="$here/promtool"
tag=promtool
# shellcheck source=hack/lib.sh
. "$here/lib.sh"
require_go "promtool"

key=$(cache_key "$mod")
out="$cache_root/promtool/$key"
link_current() { ln -sfn "$key" "$cache_root/promtool/current"; }

if [ -x "$out/bin/promtool" ]; then
  link_current
  step "cached in $out/bin"
  echo "$out/bin/promtool"
  exit 0
fi

export GOSUMDB=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
cd "$mod"
start=$SECONDS
step "building promtool into $out/bin ($go_version, $(nproc) cores; a cold build compiles about 1,400 packages and takes 10-20 minutes)"
step "1/3 downloading Go modules"
go mod download || fail "download modules" "could not fetch the modules in hack/promtool/go.mod from the Go module proxy ($(go env GOPROXY))"
go mod verify >/dev/null || fail "download modules" "module checksums do not match hack/promtool/go.sum"
version=$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus) \
  || fail "read versions" "github.com/prometheus/prometheus is not required by hack/promtool/go.mod"
mkdir -p "$out/bin"
t=$SECONDS
step "2/3 compiling promtool $version (github.com/prometheus/prometheus/cmd/promtool)"
go build -trimpath -ldflags "-s -w" -o "$out/bin/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool \
  || fail "compile promtool" "go build github.com/prometheus/prometheus/cmd/promtool failed (see the compiler output above)"
step "2/3 promtool done in $((SECONDS - t))s"
step "3/3 checking the binary"
"$out/bin/promtool.tmp" --version >/dev/null 2>&1 \
  || fail "check promtool" "the built binary does not run"
mv "$out/bin/promtool.tmp" "$out/bin/promtool"
link_current
step "built in $((SECONDS - start))s, $(du -sh "$out/bin" | cut -f1) on disk"
echo "$out/bin/promtool"
