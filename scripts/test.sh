#!/usr/bin/env bash
# README command 2 (and CI): install what is missing, then run the whole suite —
# formatting and vet, unit and in-process integration tests with the race detector,
# and the end-to-end tests with real processes, FUSE mounts, kill -9 and network
# namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH=/usr/local/bin:/usr/local/go/bin:$PATH
timeout=${TEST_TIMEOUT:-20m}
files=$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*')
unformatted=$(gofmt -l $files)
if [ -n "$unformatted" ]; then
  echo "gofmt needed:"; echo "$unformatted"; exit 1
fi
go vet ./...
go test -race -timeout "$timeout" ./internal/... ./cmd/...
go build -o strata ./cmd/strata
STRATA_BIN="$PWD/strata" go test -timeout "$timeout" -count=1 ./test/...
