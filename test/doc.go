// Package test holds Strata's end-to-end tests: real processes (the strata
// binary from $STRATA_BIN or a fresh build), real FUSE mounts, kill -9,
// network namespaces, and a POSIX suite that any mounted path can be run
// through. They need root and /dev/fuse and skip with a reason otherwise.
package test
