# The two commands of the README:
#   make up    — install what is missing, build, start the local cluster under
#                ./strata-data and mount it at ./mnt (Ctrl-C unmounts and stops)
#   make test  — install what is missing and run the whole test suite
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
TEST_TIMEOUT ?= 20m

.PHONY: up test deps build vet unit e2e bench-peers fmt
up: deps build
	./strata up --data ./strata-data --mount ./mnt

deps:
	@bash scripts/install-deps.sh

build:
	$(GO) build -o strata ./cmd/strata

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

# Unit and in-process integration tests, with the race detector.
unit:
	$(GO) test -race -timeout $(TEST_TIMEOUT) ./internal/... ./cmd/...

# End-to-end tests with real processes, real FUSE mounts, kill -9, network namespaces.
e2e: build
	STRATA_BIN=$(CURDIR)/strata $(GO) test -timeout $(TEST_TIMEOUT) -count=1 ./test/...

test: deps vet unit e2e

bench-peers: build
	./strata bench peers
