# Sourced by each hack/*/build.sh once it has set `here` to its own folder:
# that folder's versions.env, the cache root every built tool shares
# (outside the clone, keyed by version, so only a missing binary triggers a
# build), and log(), which tags each line with the folder's name.
#
#   PETSTORE_TOOLS_DIR   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/petstore-operator)
# shellcheck source=/dev/null
source "$here/versions.env"
cache_root="${PETSTORE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/petstore-operator}"
log_tag=$(basename "$here")
log() { printf '[%s] %s\n' "$log_tag" "$*" >&2; }
# tool_dir NAME: the cache folder NAME (a name that carries the versions),
# made if missing.
tool_dir() { mkdir -p "$cache_root/$1" && printf '%s\n' "$cache_root/$1"; }
# go_install_once BIN_DIR NAME PACKAGE@VERSION [GO INSTALL FLAGS...]: builds
# the released module's command with `go install` (no replace directives
# needed, none taken) into BIN_DIR/NAME, unless it is there already; the
# flags add build tags and version stamps. Nothing is left behind on failure.
go_install_once() {
  local bin_dir=$1 name=$2 package=$3 work start
  shift 3
  [[ -x "$bin_dir/$name" ]] && return 0
  log "building $name from $package (first run only)"
  start=$SECONDS
  work=$(mktemp -d)
  if ! GOBIN="$work" CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
    go install -trimpath "$@" "$package"; then
    rm -rf "$work"
    return 1
  fi
  local built=${package%@*}
  mv "$work/${built##*/}" "$bin_dir/$name"
  rm -rf "$work"
  log "built $name in $((SECONDS - start))s"
}
