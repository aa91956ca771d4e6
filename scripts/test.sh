#!/usr/bin/env bash
# README command 2 (and CI): install what is missing, then run the whole suite —
# formatting and vet, unit and in-process integration tests with the race detector,
# and the end-to-end tests with real processes, FUSE mounts, kill -9 and network
# namespaces; the timing-sensitive tests also run without the race detector. Progress shows package by package (scripts/testprogress), each package
# closing with go test's usual ok/FAIL line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH=/usr/local/bin:/usr/local/go/bin:$PATH
timeout=${TEST_TIMEOUT:-20m}
files=$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*')
echo "== gofmt, go vet" >&2
unformatted=$(gofmt -l $files)
if [ -n "$unformatted" ]; then
  echo "gofmt needed:"; echo "$unformatted"; exit 1
fi
go vet ./...
echo "== unit and in-process integration tests, race detector (the race build takes minutes before the first package runs)" >&2
go test -race -timeout "$timeout" -json ./internal/... ./cmd/... | go run ./scripts/testprogress
# The race detector slows everything down and so hides lost wake-ups and
# ordering bugs that need the real speed: the timing-sensitive tests (the raft
# log's syncer, metadata durability barriers, a file's size seen by every call
# on the writing mount) run again without it, 10 times.
echo "== timing-sensitive tests without the race detector, 10 runs each" >&2
go test -count=10 -timeout 10m -json \
  -run 'TestWAL|TestMetaBarriers$|TestEmptyCloseDurableBySyncDelay|TestDurabilityOfAnswers|TestStoreFlushSyncsLogFirst|TestSyncToIndex|TestSyncDetectsLostChange|TestSizeAgreesAfterEachOp$' \
  ./internal/consensus/ ./internal/client/ ./internal/meta/ ./internal/fuse/ | go run ./scripts/testprogress
go build -o strata ./cmd/strata
echo "== end-to-end tests: real processes, FUSE mounts, kill -9, network namespaces" >&2
STRATA_BIN="$PWD/strata" go test -timeout "$timeout" -count=1 -json ./test/... | go run ./scripts/testprogress
