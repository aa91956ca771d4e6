// Package history records what clients of a file system did and saw, and
// checks that it was linearizable, with porcupine (github.com/anishathalye/
// porcupine), against a model of a few names and their contents; and that
// creates and removes took effect exactly once.
//
// # Concepts
//
// An Op is one client operation: what was asked (Input: create, unlink,
// rename, write, truncate, read or stat of a name), what came back (Output:
// an outcome and what was read), and its invoke and complete times on the
// monotonic clock. An operation that failed with an error that does not
// prove it did not happen (EIO, a timeout, an op still running when the
// recording stopped) is Unknown: in the check it completes "at infinity"
// (after every other operation) and may or may not have taken effect, so
// the checker may order it anywhere after its invocation, or after
// everything, which is the same as never.
//
// A History is safe for concurrent recording (Begin/End around each op).
// Run drives N recorders of random operations from a seed on a directory,
// typically a FUSE mount, and returns the history with a final stat of
// every name appended (by a last client, after every recorder stopped).
//
// # The model
//
// Names live in two kinds of directory, partitioned for porcupine so that
// checking stays fast (each partition is checked alone):
//
//   - content names ("c/f3"): create (O_CREAT|O_EXCL), unlink, write,
//     truncate, read and stat; one partition per name. A write opens
//     without O_TRUNC and writes one fixed-length value at offset 0, so
//     that the file's content changes in one step (an O_TRUNC open and the
//     write are two steps, and a reader between them sees an empty file,
//     which a one-step model cannot tell from a lost write); truncate is
//     its own operation (open O_TRUNC, close).
//   - rename names ("r/r1"): create, unlink, rename within the directory
//     and stat; one partition per directory, bounded by its few names.
//     Content is not written there: a write through a descriptor opened
//     before a rename lands in the renamed file, which a model keyed by
//     name cannot follow. The file's identity is its inode number (create
//     and stat report it), so a rename undone or a file doubled shows.
//
// The model of a partition is the map name → (inode, content) of the names
// that exist; an operation's outcome is checked against it ("create of an
// existing name answers EEXIST" ...). A create whose outcome is unknown
// binds the inode number the next stat reports.
//
// # Exactly once
//
// ExactlyOnce checks the final stat of every content name against the
// creates and unlinks acknowledged: each create applied turns the name from
// absent to present and each unlink back, so creates applied − unlinks
// applied = present at the end, with acknowledged ⊆ applied ⊆ acknowledged
// ∪ unknown.
//
// # On failure
//
// Check writes porcupine's HTML visualisation of the failing partitions to
// $STRATA_HISTORY_DIR, or else to a directory under os.TempDir that is kept,
// and names the file in its error.
package history
