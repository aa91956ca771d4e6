// Package admin is the logic behind the admin commands of cmd/strata
// (status, stripe, fsck, --version) and the bookkeeping that lets them find
// a cluster without flags. cmd/strata only parses flags and prints.
//
// # Concepts
//
//   - A runtime record (Record) is a small JSON file that every running mount
//     daemon (strata mount, strata up) keeps in the runtime directory
//     (/run/strata as root, else $XDG_RUNTIME_DIR/strata; $STRATA_RUNTIME_DIR
//     overrides both) while it serves: its pid, mount point, metadata
//     address, key file and, for strata up, the data directory. Records of
//     processes that are gone are ignored.
//   - A Strata mount shows the metadata address in its source
//     ("strata@ADDR" in /proc/self/mountinfo and df), so a path on a mount
//     leads to its cluster even without a record.
//   - Locate combines flags, environment, the mount under the working
//     directory, ./strata-data and the records of running local clusters.
//
// # Pitfalls
//
// A record can outlive its process after kill -9; records are trusted only
// while their pid is alive and, for a mount, while the mount point is still
// a Strata mount.
package admin
