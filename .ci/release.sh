#!/usr/bin/env bash
# Release helper for the modules of this repository (RELEASING.md says when
# to run what). Every module listed in go.work is covered; none is named
# here, so a new nested module needs no edit of this script.
#
#   .ci/release.sh bump VERSION   require every project module at VERSION in
#                                 every go.mod, and point go.work's replaces
#                                 at VERSION (the release commit)
#   .ci/release.sh tags VERSION   print the tags of a release, in push order
#   .ci/release.sh tag VERSION    create those tags (annotated) at HEAD, after
#                                 checking the tree is clean and publishable
#   .ci/release.sh check          fail unless the go.mod files are publishable:
#                                 no replace of a project module, one version,
#                                 go.work replaces in place, LICENSE copies
#   .ci/release.sh adopt          turn a module that arrived with
#                                 `replace ... => ../..` into the workspace
#                                 form (drop the replace, copy LICENSE, bump)
#   .ci/release.sh tidy           `go mod tidy` every module, the nested ones
#                                 against the tree served by a local proxy
#                                 (a plain `go mod tidy` there would ask the
#                                 public proxy for an unpublished version)
#   .ci/release.sh go DIR ARGS... run `go ARGS...` in module DIR the same
#                                 way, e.g. `.ci/release.sh go contrib/redis
#                                 get example.com/dep@v1.2.3` (in the
#                                 workspace, go get in a nested module asks
#                                 the public proxy for the unpublished root)
#   .ci/release.sh proxy VERSION DIR
#                                 write a file-based module proxy of every
#                                 module at VERSION, built from the tree
#
# The work is done by .ci/releasetool, a Go program in a module of its own
# (golang.org/x/mod), built on first use into a cache directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

die() { echo "release.sh: $*" >&2; exit 1; }

tool() {
  local bin=${IDEMHTTP_RELEASETOOL:-${TMPDIR:-/tmp}/idemhttp-releasetool-$(id -u)}
  # Rebuild when the source changed: go build is a no-op when up to date.
  (cd "$ROOT/.ci/releasetool" && GOWORK=off GOFLAGS=-mod=readonly go build -o "$bin" .) >&2
  "$bin" -work "$ROOT/go.work" "$@"
}

# The upstream proxy as configured here, without "direct" and "off" (the
# local proxy goes in front; a module the upstream lacks is not to be
# fetched from a VCS host).
upstream_proxy() {
  local p out=()
  IFS=',|' read -ra p <<<"$(go env GOPROXY)"
  for x in "${p[@]}"; do
    case "$x" in direct | off | "") ;; *) out+=("$x") ;; esac
  done
  (IFS=,; echo "${out[*]}")
}

# isolated DIR CMD...: run CMD outside the workspace against the local proxy
# in DIR/proxy, with a module cache of its own in DIR/modcache. The shared
# cache must never hold a project module at a version built from a work
# tree: after the real release it would shadow the published one (and fail
# its checksum). The shared cache's download directory serves, offline,
# everything else it already has; the upstream proxy the rest.
isolated() {
  local dir=$1 shared up
  shift
  shared=$(go env GOMODCACHE)
  up=$(upstream_proxy)
  GOWORK=off GOFLAGS="-mod=mod -modcacherw" GONOSUMDB=github.com/idemkit GOMODCACHE="$dir/modcache" \
    GOPROXY="file://$dir/proxy,file://$shared/cache/download${up:+,$up}" "$@"
}

cmd=${1:-}
case "$cmd" in
  bump | tags)
    [ $# = 2 ] || die "usage: $0 $cmd VERSION"
    tool "$cmd" "$2"
    ;;
  check | adopt | modules | version)
    tool "$cmd"
    ;;
  tag)
    [ $# = 2 ] || die "usage: $0 tag VERSION"
    [ -z "$(git status --porcelain)" ] || die "the tree has uncommitted changes"
    tool check
    [ "$(tool version)" = "$2" ] || die "the modules require each other at $(tool version), not $2: run $0 bump $2 and commit"
    for t in $(tool tags "$2"); do
      git tag -a "$t" -m "$t"
      echo "tagged $t"
    done
    echo "push them in this order: git push origin $(tool tags "$2" | tr '\n' ' ')"
    ;;
  proxy)
    [ $# = 3 ] || die "usage: $0 proxy VERSION DIR"
    tool proxy -version "$2" -out "$3"
    ;;
  tidy | go)
    [ "$cmd" = tidy ] || [ $# -ge 3 ] || die "usage: $0 go DIR ARGS..."
    version=$(tool version)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    tool proxy -version "$version" -out "$tmp/proxy" >/dev/null
    if [ "$cmd" = go ]; then
      dir=$2
      shift 2
      (cd "$dir" && isolated "$tmp" go "$@")
    else
      while read -r path dir _; do
        echo "tidy $path"
        (cd "$dir" && isolated "$tmp" go mod tidy)
      done < <(tool modules)
    fi
    # The hashes just written for project modules are those of the tree, not
    # of what a tag will publish: leave them out (see RELEASING.md).
    tool stripsums
    ;;
  *)
    sed -n '2,30p' "$0" >&2
    exit 2
    ;;
esac
