package test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/testutil"
)

var (
	randSeed     = flag.Int64("seed", 0, "seed for TestRandomOpsAgainstLocal and the history tests (0: time-based)")
	randOps      = flag.Int("ops", 1500, "operations in TestRandomOpsAgainstLocal")
	randDuration = flag.Duration("ops-time", 60*time.Second, "time bound of TestRandomOpsAgainstLocal")
)

// TestRandomOpsAgainstLocal runs the same random sequence of writes,
// truncates, reads, renames, links and unlinks on Strata and on a local
// directory and compares every result: the error (as errno), the bytes read,
// and at the end the whole tree (names, sizes, link counts, content).
// A failure prints the seed; -seed replays it.
func TestRandomOpsAgainstLocal(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2})
	seed := *randSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (replay: go test ./test -run TestRandomOpsAgainstLocal -seed %d)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	strataRoot := filepath.Join(c.Mount(0), "rand")
	localRoot := filepath.Join(t.TempDir(), "rand")
	for _, r := range []string{strataRoot, localRoot} {
		if err := os.MkdirAll(filepath.Join(r, "d0"), 0o755); err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(r, "d1"), 0o755)
	}
	names := []string{"a", "b", "c", "d0/e", "d0/f", "d1/g", "d1/h", "d1/i"}
	pick := func() string { return names[rng.Intn(len(names))] }
	errno := func(err error) string {
		if err == nil {
			return "ok"
		}
		var en syscall.Errno
		if errors.As(err, &en) {
			return en.Error()
		}
		return err.Error()
	}
	deadline := time.Now().Add(*randDuration)
	ops := 0
	for ; ops < *randOps && time.Now().Before(deadline); ops++ {
		op := rng.Intn(13)
		off2 := int64(rng.Intn(3 << 20))
		a, b := pick(), pick()
		off := int64(rng.Intn(3 << 20))
		n := rng.Intn(300 << 10)
		data := make([]byte, n)
		rng.Read(data)
		size := int64(rng.Intn(4 << 20))
		var desc string
		res := [2]string{}
		reads := [2][]byte{}
		for i, root := range []string{strataRoot, localRoot} {
			pa, pb := filepath.Join(root, a), filepath.Join(root, b)
			var err error
			switch op {
			case 0, 1, 2: // write
				desc = fmt.Sprintf("write %s off=%d len=%d", a, off, n)
				var f *os.File
				f, err = os.OpenFile(pa, os.O_CREATE|os.O_WRONLY, 0o644)
				if err == nil {
					_, err = f.WriteAt(data, off)
					if cerr := f.Close(); err == nil {
						err = cerr
					}
				}
			case 3: // read
				desc = fmt.Sprintf("read %s off=%d len=%d", a, off, n)
				var f *os.File
				f, err = os.Open(pa)
				if err == nil {
					buf := make([]byte, n)
					k, rerr := f.ReadAt(buf, off)
					reads[i] = buf[:k]
					if rerr != nil && rerr.Error() != "EOF" {
						err = rerr
					}
					f.Close()
				}
			case 4:
				desc = fmt.Sprintf("truncate %s %d", a, size)
				err = os.Truncate(pa, size)
			case 5:
				desc = fmt.Sprintf("rename %s %s", a, b)
				err = os.Rename(pa, pb)
			case 6:
				desc = fmt.Sprintf("link %s %s", a, b)
				err = os.Link(pa, pb)
			case 7:
				desc = fmt.Sprintf("unlink %s", a)
				err = os.Remove(pa)
			case 8:
				desc = fmt.Sprintf("stat %s", a)
				var st os.FileInfo
				st, err = os.Stat(pa)
				if err == nil {
					reads[i] = []byte(fmt.Sprintf("size=%d nlink=%d mode=%v", st.Size(), st.Sys().(*syscall.Stat_t).Nlink, st.Mode()))
				}
			case 9:
				desc = fmt.Sprintf("read whole %s", a)
				reads[i], err = os.ReadFile(pa)
			case 10: // a file written nameless (O_TMPFILE), then named a
				desc = fmt.Sprintf("tmpfile in %s off=%d len=%d, linkat to %s", filepath.Dir(a), off, n, a)
				var fd int
				fd, err = unix.Open(filepath.Dir(pa), unix.O_TMPFILE|unix.O_RDWR, 0o640)
				if err == nil {
					_, err = unix.Pwrite(fd, data, off)
					if err == nil {
						err = unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, pa, unix.AT_SYMLINK_FOLLOW)
					}
					if cerr := unix.Close(fd); err == nil {
						err = cerr
					}
				}
			case 11: // where data and holes are (writes and truncates make both)
				desc = fmt.Sprintf("lseek SEEK_DATA/SEEK_HOLE %s from %d", a, off)
				var f *os.File
				f, err = os.Open(pa)
				if err == nil {
					d, derr := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
					h, herr := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
					reads[i] = []byte(fmt.Sprintf("data %d %v hole %d %v", d, derr, h, herr))
					f.Close()
				}
			case 12: // copy_file_range from a to b (b created if missing)
				desc = fmt.Sprintf("copy_file_range %s off=%d → %s off=%d len=%d", a, off, b, off2, n)
				var in, out *os.File
				if in, err = os.Open(pa); err == nil {
					if out, err = os.OpenFile(pb, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
						offIn, offOut := off, off2
						var k int
						k, err = unix.CopyFileRange(int(in.Fd()), &offIn, int(out.Fd()), &offOut, n, 0)
						reads[i] = []byte(fmt.Sprintf("copied %d", k))
						if cerr := out.Close(); err == nil {
							err = cerr
						}
					}
					in.Close()
				}
			}
			res[i] = errno(err)
		}
		if res[0] != res[1] {
			t.Fatalf("op %d %s: strata %s, local %s (seed %d)", ops, desc, res[0], res[1], seed)
		}
		if !bytes.Equal(reads[0], reads[1]) {
			t.Fatalf("op %d %s: results differ: strata %d bytes %.60q, local %d bytes %.60q (seed %d)",
				ops, desc, len(reads[0]), reads[0], len(reads[1]), reads[1], seed)
		}
	}
	t.Logf("%d operations", ops)
	if a, b := treeOf(t, strataRoot), treeOf(t, localRoot); a != b {
		t.Fatalf("trees differ (seed %d):\nstrata:\n%s\nlocal:\n%s", seed, a, b)
	}
}

func treeOf(t *testing.T, root string) string {
	var lines []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			lines = append(lines, "error "+err.Error())
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		info, _ := d.Info()
		line := fmt.Sprintf("%s %v", rel, info.Mode())
		if info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" size=%d nlink=%d sum=%x", info.Size(), info.Sys().(*syscall.Stat_t).Nlink, crc(b))
		}
		lines = append(lines, line)
		return nil
	})
	sort.Strings(lines)
	var buf bytes.Buffer
	for _, l := range lines {
		buf.WriteString(l + "\n")
	}
	return buf.String()
}

func crc(b []byte) uint32 {
	var h uint32 = 2166136261
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	return h
}
