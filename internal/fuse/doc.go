// Package fuse serves a Strata file system to the Linux kernel with
// go-fuse's raw API (fuse.RawFileSystem). It is the one place where errors
// become errno values: every failure is logged with its real cause (debug
// for expected outcomes like ENOENT, warn for the rest) and then answered
// as the syscall.Errno it wraps, EIO otherwise.
//
// # Concepts
//
// NodeId is the Strata inode number (root = 1). Inode numbers are never
// reused while a client may hold them, so the kernel's lookup counts need
// no bookkeeping; Forget only drops what the adapter remembers of what it
// told the kernel about the inode. File handles map to client.File;
// directory handles hold a listing cursor.
//
// Mount options: fsname and subtype "strata" (type fuse.strata),
// allow_other + default_permissions (the kernel checks permissions for
// every user; modes are reported exactly as stored, 0000 stays 0000; the
// kernel applies the caller's umask before create and we never apply one),
// 1 MiB reads and writes (MaxWrite, MaxPages follow), 1 MiB kernel
// read-ahead, POSIX and flock locks forwarded, MaxBackground 64, direct
// mount(2) when root.
//
// Caching and consistency: entries and attributes are cached by the
// kernel for 1 s. Open asks the metadata service for fresh attributes; the
// page cache is kept (FOPEN_KEEP_CACHE) only if size and mtime equal what
// the kernel last got from us, otherwise the kernel's cached attributes
// are invalidated too (close-to-open across mounts). O_DIRECT opens get
// FOPEN_DIRECT_IO. O_TRUNC comes with the OPEN (atomic_o_trunc), not as a
// SETATTR after it: the kernel keeps its old size during a SETATTR of the
// size, over pages that READs answered short zero-fill, so a read racing
// a truncate would see zeros; the client truncates within the open while
// its reads of the file wait, and they answer the old data or the new
// size. A narrow race remains in the kernel: a READ answered short while
// another change of the file's attributes (a GETATTR answer, an unlink, a
// WRITE's) came in since it was sent does not lower the kernel's size
// (fuse_read_update_size), so until the open's answer sets it a reader may
// copy the zeroed page. An OPEN of an inode that is gone (an unlink on
// another thread or mount that the kernel has not seen answered) is
// answered ESTALE, not ENOENT: open(2) then looks the name up again, so
// that it fails with ENOENT only when a stat after it would too.
//
// Sizes: the kernel sets its size from a WRITE's reply and takes every
// GETATTR (LOOKUP, READDIRPLUS) answer to a request sent after that reply
// as newer, so such an answer must never carry a size older than what
// this mount acknowledged; the client's merge sees to it (client doc:
// Pitfalls). lseek's SEEK_END is the kernel's own (a GETATTR when its
// attributes are stale, then its size); only SEEK_DATA/SEEK_HOLE reach
// Lseek here. The largest file is the client's (EFBIG at write, truncate,
// fallocate, copy_file_range; layout.MaxFileSize): FUSE's INIT cannot
// lower the kernel's s_maxbytes (2^63−1 for FUSE), statfs has no field for
// it, and pathconf(_PC_FILESIZEBITS) is answered by the C library from
// the file system type (32 for FUSE) without asking; the layout xattr
// reports it (max_file_bytes).
//
// Directory offsets: '.' = 1, '..' = 2, then a per-handle counter; the
// handle remembers the name behind each of the last 16,384 offsets it
// emitted, and every page continues after a name (the service's cursor),
// so listings are complete and duplicate-free under concurrent change and
// for any directory size.
//
// Locks: GetLk/SetLk/SetLkw map to the service's locks (flock when
// FUSE_LK_FLOCK is set). SetLkw asks repeatedly (each ask waits a bounded
// time in the service) until granted or the request is interrupted
// (EINTR). POSIX locks of an owner are released on FLUSH (any close by the
// process); RELEASE of a handle — the last close of its open file
// description — drops the locks taken through that handle (its OFD locks
// and flocks: client.File.Release), never an owner's locks: the kernel's
// owner ids are addresses of its files_struct or struct file, reused once
// freed, and RELEASE is sent in the background, after a newer open may have
// got the same owner id and locked. An OFD lock or flock may so outlive
// close(2) by the moment the RELEASE takes to arrive (POSIX locks, dropped
// on FLUSH, do not). Locks order data as NFS's do: an unlock, and the FLUSH
// or RELEASE that drops locks, first sends what the file's handles buffered
// to the stores; a lock granted through a handle drops the kernel's pages
// of the file (and the client's read-ahead), so that reads under the lock
// see what the previous holder wrote on any mount. Sizes are not refreshed
// at the grant: a file the previous holder extended shows its new size
// after that holder's close or fsync (close-to-open).
//
// The virtual xattr user.strata.layout (not listed) reads a file's layout
// as JSON and sets a directory's default ("stripe_count=N,stripe_size=S"):
// `strata stripe` uses it.
//
// # Pitfalls
//
//   - Never call into a mount from the process serving it while holding a
//     lock the server needs: tests that use the mount in-process must not
//     outlive its server.
//   - The kernel asks security.capability before every write; the client
//     answers "absent" without a round trip for a file it created, and
//     for one attribute timeout after the service said so (xattrcache.go).
//   - setuid/setgid clearing on write is done by the kernel with a SETATTR
//     of the mode (HANDLE_KILLPRIV is not negotiated).
package fuse
