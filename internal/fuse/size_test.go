package fuse

import (
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSizeAgreesAfterEachOp is a small fsx: one process closes and reopens
// its file every few operations, truncates up and down, writes past the
// end (with pwrite and through an O_APPEND descriptor) and inside, and
// after every operation asks the size every way a program can — fstat,
// stat by path, lseek(SEEK_END), and where an O_APPEND write lands — and
// all must equal the size the operations made. Size commits run while the
// writer's next operations do — the kernel sends the RELEASE of a closed
// descriptor in the background, and another process opens and closes the
// file all along — which is where a stale size came from: a commit on its
// way made the file look clean to a GETATTR whose metadata answer
// predated it. (Before the fix it failed every run, within 500 ops.)
func TestSizeAgreesAfterEachOp(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 1, 2)
	dir, _ := tc.mount(nil)
	p := filepath.Join(dir, "fsx")
	must(t, os.WriteFile(p, nil, 0o644))

	seed := rand.Int63()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	const ops = 2000
	const maxLen = 3 << 20 // across stripe units (1 MiB) and both slots
	var size int64
	buf := pattern(3, 256<<10)

	// fd and afd (O_APPEND) do the work; the other descriptors only add
	// releases (each commits what the file's handles wrote).
	var fd, afd int = -1, -1
	var fds []int
	// reopen opens the file anew and then closes the descriptors of the
	// round before: their releases then run with the next operation.
	reopen := func() {
		old := fds
		fds = nil
		for _, fl := range []int{unix.O_RDWR, unix.O_WRONLY | unix.O_APPEND, unix.O_RDONLY, unix.O_RDONLY} {
			d, err := unix.Open(p, fl, 0)
			must(t, err)
			fds = append(fds, d)
		}
		fd, afd = fds[0], fds[1]
		for _, d := range old {
			must(t, unix.Close(d))
		}
	}
	reopen()
	defer func() {
		for _, d := range fds {
			unix.Close(d)
		}
	}()
	// Another process of the mount (a reader, a backup) opens and closes
	// the file all along: every close commits what the writer wrote, at
	// any moment of its operations. It changes no size.
	stop := make(chan struct{})
	readerDone := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				readerDone <- nil
				return
			default:
			}
			d, err := unix.Open(p, unix.O_RDONLY, 0)
			if err == nil {
				err = unix.Close(d)
			}
			if err != nil {
				readerDone <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-readerDone; err != nil {
			t.Errorf("the other reader: %v", err)
		}
	}()

	check := func(i int, op string) {
		t.Helper()
		if got := sizesOf(t, fd, p); got != [3]int64{size, size, size} {
			t.Fatalf("op %d (%s): size %d, but fstat, stat, lseek(SEEK_END) say %v (seed %d)", i, op, size, got, seed)
		}
	}
	// One operation of a kind (0: truncate up, 1: truncate down, 2: an
	// extending pwrite, 3: an O_APPEND write, 4: a write inside).
	do := func(i, kind int) string {
		switch kind {
		case 0:
			size += 1 + rng.Int63n(maxLen/2)
			must(t, unix.Ftruncate(fd, size))
			return "truncate up"
		case 1:
			size = rng.Int63n(size + 1)
			must(t, unix.Ftruncate(fd, size))
			return "truncate down"
		case 2: // sometimes leaving a hole
			n := 1 + rng.Intn(len(buf))
			off := max(size-rng.Int63n(int64(n)), 0) + rng.Int63n(4096)
			if _, err := unix.Pwrite(fd, buf[:n], off); err != nil {
				t.Fatalf("op %d: pwrite %d at %d: %v", i, n, off, err)
			}
			size = max(size, off+int64(n))
			return "extending write"
		case 3: // lands at the end the kernel knows
			n := 1 + rng.Intn(len(buf))
			if _, err := unix.Write(afd, buf[:n]); err != nil {
				t.Fatalf("op %d: append %d: %v", i, n, err)
			}
			at, err := unix.Seek(afd, 0, unix.SEEK_CUR)
			must(t, err)
			if at != size+int64(n) {
				t.Fatalf("op %d: an append of %d bytes to a file of %d ended at %d (seed %d)", i, n, size, at, seed)
			}
			size += int64(n)
			return "append"
		default:
			if size == 0 {
				return "nothing"
			}
			off := rng.Int63n(size)
			n := min(int64(1+rng.Intn(len(buf))), size-off)
			if _, err := unix.Pwrite(fd, buf[:n], off); err != nil {
				t.Fatalf("op %d: pwrite %d at %d: %v", i, n, off, err)
			}
			return "inner write"
		}
	}
	// Rounds of: close and reopen; what fsx did when it failed (truncate
	// up, then write past the end) or an extending write or append
	// alone; then a random operation.
	for i := 0; i < ops; {
		reopen()
		var kinds []int
		switch rng.Intn(3) {
		case 0:
			kinds = []int{0, 2}
		case 1:
			kinds = []int{2}
		default:
			kinds = []int{3}
		}
		kinds = append(kinds, rng.Intn(5))
		for _, k := range kinds {
			check(i, do(i, k))
			i++
		}
	}
}

// sizesOf is the size of the file open as fd at path p as fstat, stat and
// lseek(SEEK_END) give it.
func sizesOf(t *testing.T, fd int, p string) [3]int64 {
	t.Helper()
	var st, pst unix.Stat_t
	must(t, unix.Fstat(fd, &st))
	must(t, unix.Stat(p, &pst))
	end, err := unix.Seek(fd, 0, unix.SEEK_END)
	must(t, err)
	return [3]int64{st.Size, pst.Size, end}
}
