# Shared by the hack/build-*.sh scripts, which build pinned Go tools into a cache keyed by
# their go.mod and go.sum. Set `tag` (the log prefix) before sourcing.

cache_root=${NICOP_CACHE:-$HOME/.cache/nicop}

step() { printf '[%s] %s\n' "$tag" "$*" >&2; }
fail() { printf '[%s] FAILED at step "%s": %s\n' "$tag" "$1" "$2" >&2; exit 1; }

# require_go WHAT: Go >= 1.26 must be on PATH to build WHAT.
require_go() {
  command -v go >/dev/null 2>&1 || fail "find Go" "no 'go' on PATH; install Go >= 1.26 (https://go.dev/dl) and retry"
  go_version=$(go env GOVERSION)
  case "$go_version" in
    go1.2[6-9]*|go1.[3-9]*) ;;
    *) fail "find Go" "Go >= 1.26 is needed to build $1, found $go_version" ;;
  esac
}

# cache_key MODULE_DIR: changes whenever a pin in the module changes.
cache_key() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-12; }
