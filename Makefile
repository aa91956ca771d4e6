# Shortcuts for developers. The README's two commands are scripts/up.sh and
# scripts/test.sh (they need nothing but bash on a fresh machine):
#   make up    — scripts/up.sh: install, build, run the local cluster at ./mnt
#   make test  — scripts/test.sh: install and run the whole suite (what CI runs)
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
TEST_TIMEOUT ?= 20m

.PHONY: up test deps build vet unit e2e bench-peers fmt
up:
	bash scripts/up.sh

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

test:
	bash scripts/test.sh

bench-peers: build
	./strata bench peers
