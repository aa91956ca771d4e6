#!/usr/bin/env bash
# README command 1: install what is missing, build, install the strata binary where a
# shell finds it (/usr/local/bin, or $STRATA_BIN_DIR), and run the embedded local cluster
# (data in ./strata-data, mounted at ./mnt) in the foreground. Ctrl-C unmounts and stops.
# STRATA_SKIP_DEPS=1 skips the dependency check (tests).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${STRATA_SKIP_DEPS:-}" ] || bash scripts/install-deps.sh
export PATH=/usr/local/bin:/usr/local/go/bin:$PATH
# The commit goes into `strata --version` when this is a git checkout (some
# machines set GOFLAGS=-buildvcs=false in go env; a tarball has no .git).
vcs=false
git rev-parse --git-dir >/dev/null 2>&1 && vcs=true
go build -buildvcs=$vcs -o strata ./cmd/strata
bindir=${STRATA_BIN_DIR:-/usr/local/bin}
# A new file renamed over the old one: a strata running from there keeps its binary.
if install -m 0755 strata "$bindir/.strata.new" 2>/dev/null && mv -f "$bindir/.strata.new" "$bindir/strata"; then
  echo "up.sh: installed $bindir/strata (strata status, strata stripe … work from any directory)" >&2
  exec "$bindir/strata" up --data ./strata-data --mount ./mnt "$@"
fi
echo "up.sh: cannot write $bindir (not root?): the binary is $PWD/strata; run it as ./strata from $PWD" >&2
exec ./strata up --data ./strata-data --mount ./mnt "$@"
