package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Chunk files are read without moving their access time (O_NOATIME):
// under relatime the first read of a chunk written since would otherwise
// dirty its inode, for every small file of a cold read phase.
func TestChunkReadsKeepAtime(t *testing.T) {
	e := newEnv(t, 1, nil)
	for _, size := range []int{3901, 3 << 20} { // inline sums; a sidecar
		ino := uint64(0xa000 + size)
		data := pattern(size, size)
		e.mustWrite(1, ino, 0, data, true)
		old := time.Now().Add(-time.Hour).Truncate(time.Second)
		for _, p := range []string{dataPath(e.dirs[0], ino), sumPath(e.dirs[0], ino)} {
			if err := os.Chtimes(p, old, time.Time{}); err != nil && !(errors.Is(err, os.ErrNotExist) && size < 48<<10) {
				t.Fatal(err)
			}
		}
		e.restart() // a fresh open of the files, too
		if b := e.mustRead(1, ino, 0, uint32(size)); !bytes.Equal(b, data) {
			t.Fatalf("chunk of %d bytes read wrong", size)
		}
		for _, p := range []string{dataPath(e.dirs[0], ino), sumPath(e.dirs[0], ino)} {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				if errors.Is(err, unix.ENOENT) && size < 48<<10 {
					continue
				}
				t.Fatal(err)
			}
			if at := time.Unix(st.Atim.Unix()); !at.Equal(old) {
				t.Fatalf("chunk of %d bytes: %s's access time moved from %v to %v by a read", size, filepath.Base(p), old, at)
			}
		}
	}
}
