package store

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Test helpers that see a chunk's sums in either form: the inline
// attribute of the data file (inlinesums.go) or the sidecar.

// inlineOf reads the inline sums of ino's data file in dir; found is false
// if it has none.
func inlineOf(t *testing.T, dir string, ino uint64) (flags uint16, sums []byte, found bool) {
	t.Helper()
	f, err := os.Open(dataPath(dir, ino))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flags, sums, found, err = readInline(int(f.Fd()))
	if err != nil {
		t.Fatalf("chunk %x: %v", ino, err)
	}
	return flags, sums, found
}

// chunkFlags is the dirty flag word of ino's sums in dir, in whichever
// form they are.
func chunkFlags(t *testing.T, dir string, ino uint64) uint16 {
	t.Helper()
	if flags, _, found := inlineOf(t, dir, ino); found {
		return flags
	}
	return sidecarFlags(t, sumPath(dir, ino))
}

// setSumsClean writes a clean flag into ino's sums in dir (the sidecar's
// header, or the inline attribute), as a crash that lost the (unsynced)
// dirty flag leaves it.
func setSumsClean(t *testing.T, dir string, ino uint64) {
	t.Helper()
	flags, sums, found := inlineOf(t, dir, ino)
	if !found {
		setSidecarClean(t, dir, ino)
		return
	}
	setInline(t, dir, ino, flags&^flagDirty, sums)
}

func setInline(t *testing.T, dir string, ino uint64, flags uint16, sums []byte) {
	t.Helper()
	if err := unix.Setxattr(dataPath(dir, ino), inlineXattr, encodeInline(flags, sums), 0); err != nil {
		t.Fatal(err)
	}
}

// removeSums removes ino's sums in dir, in whichever form, as a crash
// right after the chunk's creation may leave it.
func removeSums(t *testing.T, dir string, ino uint64) {
	t.Helper()
	err := unix.Removexattr(dataPath(dir, ino), inlineXattr)
	if errors.Is(err, unix.ENODATA) {
		err = os.Remove(sumPath(dir, ino))
	}
	if err != nil {
		t.Fatal(err)
	}
}

// sidecarless runs the rest of a test with new targets in the sidecar
// form (the format 1 to 3 behaviour, and chunk_sums 1).
func sidecarless(t *testing.T) {
	inlineSumsForNewTargets.Store(false)
	t.Cleanup(func() { inlineSumsForNewTargets.Store(true) })
}
