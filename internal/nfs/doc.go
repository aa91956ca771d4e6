// Package nfs is the NFS gateway (`strata nfs`): NFS version 3 and MOUNT
// version 3 (RFC 1813), with the lock manager NLM v4 and status monitor
// NSM v1 (XNFS 3W), on one TCP port, serving the namespace through the
// client library (internal/client), so that what an NFS client writes a
// FUSE mount reads byte-exact, and the other way round.
//
// # Concepts
//
//   - Export: a directory of the namespace and its options (export.go:
//     rw/ro, sync/async, root_squash/no_root_squash/all_squash,
//     anonuid/anongid, clients=, secure). MNT hands out the handle of an
//     export's directory (or of a directory inside it) to a client on its
//     list; every later call is checked against the list again, by the
//     export its handle names.
//   - File handle (handle.go): cluster id, export id, inode number and a
//     zero generation — inode numbers are never reused, so a removed
//     file's handle finds nothing and is NFS3ERR_STALE. Handles survive a
//     gateway restart and are the same on every gateway of the cluster
//     with the same exports.
//   - Identity (access.go): the AUTH_SYS credential (uid, gid, groups),
//     squashed by the export, is who every operation runs as: files are
//     created with its ids, and the gateway checks permissions with the
//     kernel's rules (generic_permission, the sticky bit, chown/chmod
//     rules), because the metadata service does not check them — a FUSE
//     mount has the kernel do it (default_permissions).
//   - Write stability (nfs3.go write3, commit3): UNSTABLE writes are
//     answered from the client library's write-behind with the gateway's
//     verifier, new at every start; COMMIT and FILE_SYNC/DATA_SYNC writes
//     are made durable by the client library's fsync path (File.Fsync).
//     A sync export makes namespace changes durable before answering
//     (Client.SyncMeta); an async export does not.
//   - Open files (files.go): NFS has no open or close; the gateway keeps a
//     client.File per file READ or WRITE touched and releases it after
//     IdleFileTimeout.
//   - Readdir cookies (cookies.go): the names of recent READDIR pages, as
//     the metadata service pages directories by name.
//   - Locks (nlm.go, nsm.go): NLM v4 on the same port (or --nlm-port);
//     an NLM lock is a lock of the client library (client.SetLk) owned by
//     a hash of (caller_name, svid, oh), so the metadata service's lock
//     table makes NFS and FUSE locks exclude each other. Blocked requests
//     are told by a GRANTED callback; SM_NOTIFY and FREE_ALL release a
//     restarted host's locks; after a start, a grace period grants only
//     reclaims, and the hosts kept in the state directory are told to
//     reclaim (SM_NOTIFY).
//
// # Layout
//
// xdr holds the types and codecs goxdr generates from the RFCs' .x
// definitions; oncrpc serves ONC RPC programs over TCP (records,
// headers, credentials, refusals); nfstest is a small NFS client on the
// same types for tests. This package holds the procedures: mount.go
// (MOUNT), nfs3.go (files and the file system), nfsdir.go (directories).
//
// # Errors
//
// Client library errors become NFS statuses in errors.go (status), which
// logs the cause: expected outcomes (NOENT, EXIST, ACCES, STALE…) at debug,
// the rest at warn. The gateway's own refusals are errStatus values.
//
// # Goroutines
//
// oncrpc's accept loop, a reader per connection and a goroutine per call;
// the open-file reaper (openFiles.reaper), which Close stops after the
// RPC server, releasing every file (fsyncing those with UNSTABLE writes).
//
// # Pitfalls
//
//   - Pre-operation attributes (wcc_data.before) are not given: the client
//     library has none taken atomically with the operation; clients
//     revalidate from the post-operation attributes.
//   - ".." at an export's root is the root itself (a client never leaves
//     the export through it); below, the directory's parent, which the
//     metadata service answers (an older one does not: NOENT).
//   - A handle is not checked to lie inside its export's directory
//     (knfsd's subtree_check): a client on an export's list that forges a
//     handle reaches any inode, with that export's options.
package nfs
