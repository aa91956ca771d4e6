#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the embedded local cluster
# (data in ./strata-data, mounted at ./mnt) in the foreground. Ctrl-C unmounts and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH=/usr/local/bin:/usr/local/go/bin:$PATH
go build -o strata ./cmd/strata
exec ./strata up --data ./strata-data --mount ./mnt "$@"
