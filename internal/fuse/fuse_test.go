package fuse

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/client"
)

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(uint64(i)*0x9E3779B97F4A7C15>>56) ^ seed
	}
	return b
}

// alignedBuf returns n bytes aligned for O_DIRECT.
func alignedBuf(t testing.TB, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestMount(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 2, 2)
	a, _ := tc.mount(nil)
	b, cb := tc.mount(nil)
	must(t, os.Chmod(a, 0o777))

	t.Run("basics", func(t *testing.T) {
		p := filepath.Join(a, "hello")
		data := pattern(1, 3<<20+17)
		must(t, os.WriteFile(p, data, 0o644))
		got, err := os.ReadFile(p)
		must(t, err)
		if !bytes.Equal(got, data) {
			t.Fatal("read back differs")
		}
		st, err := os.Stat(p)
		must(t, err)
		if st.Size() != int64(len(data)) || st.Mode().Perm() != 0o644 {
			t.Fatalf("stat: size %d mode %v", st.Size(), st.Mode())
		}
		must(t, os.Rename(p, filepath.Join(a, "hello2")))
		must(t, os.Link(filepath.Join(a, "hello2"), filepath.Join(a, "hardlink")))
		must(t, os.Symlink("hello2", filepath.Join(a, "symlink")))
		if tgt, err := os.Readlink(filepath.Join(a, "symlink")); err != nil || tgt != "hello2" {
			t.Fatalf("readlink %q %v", tgt, err)
		}
		var sst syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(a, "hardlink"), &sst))
		if sst.Nlink != 2 {
			t.Fatalf("nlink %d", sst.Nlink)
		}
		got, err = os.ReadFile(filepath.Join(a, "symlink"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read through symlink: %v", err)
		}
		names, err := os.ReadDir(a)
		must(t, err)
		var ns []string
		for _, n := range names {
			ns = append(ns, n.Name())
		}
		for _, want := range []string{"hello2", "hardlink", "symlink"} {
			if !contains(ns, want) {
				t.Fatalf("readdir %v lacks %s", ns, want)
			}
		}
		must(t, unix.Setxattr(filepath.Join(a, "hello2"), "user.color", []byte("blue"), 0))
		buf := make([]byte, 64)
		n, err := unix.Getxattr(filepath.Join(a, "hello2"), "user.color", buf)
		if err != nil || string(buf[:n]) != "blue" {
			t.Fatalf("getxattr %q %v", buf[:n], err)
		}
		if n, err := unix.Getxattr(filepath.Join(a, "hello2"), "user.color", nil); err != nil || n != 4 {
			t.Fatalf("getxattr size %d %v", n, err)
		}
		if _, err := unix.Getxattr(filepath.Join(a, "hello2"), "user.color", make([]byte, 2)); !errors.Is(err, unix.ERANGE) {
			t.Fatalf("getxattr small buffer: %v", err)
		}
		n, err = unix.Listxattr(filepath.Join(a, "hello2"), buf)
		if err != nil || !strings.Contains(string(buf[:n]), "user.color") {
			t.Fatalf("listxattr %q %v", buf[:n], err)
		}
		must(t, unix.Removexattr(filepath.Join(a, "hello2"), "user.color"))
		if _, err := unix.Getxattr(filepath.Join(a, "hello2"), "user.color", buf); !errors.Is(err, unix.ENODATA) {
			t.Fatalf("getxattr after remove: %v", err)
		}
		// Truncate down and up.
		must(t, os.Truncate(filepath.Join(a, "hello2"), 1000))
		must(t, os.Truncate(filepath.Join(a, "hello2"), 5000))
		got, _ = os.ReadFile(filepath.Join(a, "hello2"))
		if len(got) != 5000 || !bytes.Equal(got[:1000], data[:1000]) || !bytes.Equal(got[1000:], make([]byte, 4000)) {
			t.Fatalf("after truncates: len %d", len(got))
		}
		var sfs unix.Statfs_t
		must(t, unix.Statfs(a, &sfs))
		if sfs.Bsize != 4096 || sfs.Namelen != 255 || sfs.Blocks == 0 {
			t.Fatalf("statfs %+v", sfs)
		}
		long := filepath.Join(a, strings.Repeat("x", 256))
		if err := os.WriteFile(long, nil, 0o644); !errors.Is(err, syscall.ENAMETOOLONG) {
			t.Fatalf("long name: %v", err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(a, "hardlink"), unix.AT_FDCWD, filepath.Join(a, "hello2"), unix.RENAME_NOREPLACE); !errors.Is(err, unix.EEXIST) {
			t.Fatalf("rename noreplace: %v", err)
		}
		must(t, unix.Renameat2(unix.AT_FDCWD, filepath.Join(a, "symlink"), unix.AT_FDCWD, filepath.Join(a, "hello2"), unix.RENAME_EXCHANGE))
		if fi, err := os.Lstat(filepath.Join(a, "hello2")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("after exchange: %v %v", fi, err)
		}
	})

	t.Run("modes", func(t *testing.T) {
		p := filepath.Join(a, "zero")
		fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_WRONLY, 0)
		must(t, err)
		syscall.Close(fd)
		st, err := os.Stat(p)
		must(t, err)
		if st.Mode().Perm() != 0 {
			t.Fatalf("created with 0000, shows %v", st.Mode())
		}
		must(t, os.Chmod(p, 0o640))
		must(t, os.Chmod(p, 0))
		var sst syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(b, "zero"), &sst))
		if sst.Mode&07777 != 0 {
			t.Fatalf("chmod 0000 shows %o on the other mount", sst.Mode&07777)
		}
		// The daemon's umask never applies: 0777 asked, kernel umask 0 → 0777.
		old := syscall.Umask(0)
		must(t, os.Mkdir(filepath.Join(a, "open"), 0o777))
		syscall.Umask(old)
		if st, _ := os.Stat(filepath.Join(a, "open")); st.Mode().Perm() != 0o777 {
			t.Fatalf("mkdir 0777 with umask 0 shows %v", st.Mode())
		}
	})

	t.Run("permissions", func(t *testing.T) {
		public := filepath.Join(a, "public")
		must(t, os.WriteFile(public, []byte("hello"), 0o644))
		if out, err := asNobody("cat", public); err != nil || out != "hello" {
			t.Fatalf("nobody cannot read a 0644 file: %v %q", err, out)
		}
		secret := filepath.Join(a, "secret")
		must(t, os.WriteFile(secret, []byte("top secret"), 0o600))
		out, err := asNobody("cat", secret)
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Fatalf("nobody read a 0600 file: %v %q", err, out)
		}
		suid := filepath.Join(a, "suid")
		must(t, os.WriteFile(suid, []byte("x"), 0o777))
		must(t, os.Chmod(suid, 0o4777|os.ModeSetuid))
		must(t, syscall.Chmod(suid, 0o4777))
		if out, err := asNobody("sh", "-c", "echo more >> "+suid); err != nil {
			t.Fatalf("nobody append: %v %q", err, out)
		}
		var st syscall.Stat_t
		must(t, syscall.Stat(suid, &st))
		if st.Mode&syscall.S_ISUID != 0 {
			t.Fatalf("setuid kept after a write by another user: %o", st.Mode)
		}
	})

	// No mmap here: a goroutine faulting on a page of a file served by this
	// very process cannot be stopped by the garbage collector, and the
	// collector's stop-the-world then keeps the serving goroutine from
	// answering the fault — a deadlock (seen under -race). mmap through a
	// mount served by another process is covered by test/posix_test.go.

	t.Run("direct", func(t *testing.T) {
		p := filepath.Join(a, "direct")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o644)
		must(t, err)
		buf := alignedBuf(t, 1<<20)
		copy(buf, pattern(3, len(buf)))
		for i := 0; i < 4; i++ {
			if n, err := unix.Pwrite(fd, buf, int64(i)<<20); err != nil || n != len(buf) {
				t.Fatalf("direct write: %d %v", n, err)
			}
		}
		must(t, unix.Fsync(fd))
		rb := alignedBuf(t, 4096)
		if n, err := unix.Pread(fd, rb, 3<<20+8192); err != nil || n != 4096 || !bytes.Equal(rb, buf[8192:8192+4096]) {
			t.Fatalf("direct read: %d %v", n, err)
		}
		unix.Close(fd)
		if st, _ := os.Stat(filepath.Join(b, "direct")); st.Size() != 4<<20 {
			t.Fatalf("size on the other mount %d", st.Size())
		}
	})

	t.Run("close-to-open", func(t *testing.T) {
		pa, pb := filepath.Join(a, "c2o"), filepath.Join(b, "c2o")
		must(t, os.WriteFile(pa, []byte("version one"), 0o644))
		if got, err := os.ReadFile(pb); err != nil || string(got) != "version one" {
			t.Fatalf("B read %q %v", got, err)
		}
		two := bytes.Repeat([]byte("version two "), 1000)
		must(t, os.WriteFile(pa, two, 0o644))
		got, err := os.ReadFile(pb) // within the attribute timeout
		if err != nil || !bytes.Equal(got, two) {
			t.Fatalf("B read after A's close: %d bytes %v", len(got), err)
		}
		// fsync is a barrier too: stat on B after A's fsync (fresh lookup).
		f, err := os.OpenFile(pa, os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		f.Write([]byte("tail"))
		must(t, f.Sync())
		f.Close()
		time.Sleep(1100 * time.Millisecond) // B's cached attributes expire
		if st, err := os.Stat(pb); err != nil || st.Size() != int64(len(two)+4) {
			t.Fatalf("B size after fsync: %v %v", st, err)
		}
	})

	t.Run("locks", func(t *testing.T) {
		pa, pb := filepath.Join(a, "lockfile"), filepath.Join(b, "lockfile")
		must(t, os.WriteFile(pa, []byte("x"), 0o644))
		fa, err := os.OpenFile(pa, os.O_RDWR, 0)
		must(t, err)
		fb, err := os.OpenFile(pb, os.O_RDWR, 0)
		must(t, err)
		defer fb.Close()
		must(t, unix.Flock(int(fa.Fd()), unix.LOCK_EX|unix.LOCK_NB))
		if err := unix.Flock(int(fb.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
			t.Fatalf("flock on the other mount: %v", err)
		}
		// OFD record locks exclude each other across mounts.
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 100}
		must(t, unix.FcntlFlock(fa.Fd(), unix.F_OFD_SETLK, &lk))
		lk2 := lk
		if err := unix.FcntlFlock(fb.Fd(), unix.F_OFD_SETLK, &lk2); !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("OFD lock on the other mount: %v", err)
		}
		q := unix.Flock_t{Type: unix.F_WRLCK, Start: 50, Len: 10}
		must(t, unix.FcntlFlock(fb.Fd(), unix.F_OFD_GETLK, &q))
		if q.Type != unix.F_WRLCK {
			t.Fatalf("getlk sees no conflict: %+v", q)
		}
		// A blocking waiter gets the lock once the holder closes.
		done := make(chan error, 1)
		go func() {
			l := unix.Flock_t{Type: unix.F_WRLCK, Start: 0, Len: 100}
			done <- unix.FcntlFlock(fb.Fd(), unix.F_OFD_SETLKW, &l)
		}()
		time.Sleep(300 * time.Millisecond)
		fa.Close() // releases flock and OFD locks
		select {
		case err := <-done:
			must(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("waiter not granted after close")
		}
		must(t, unix.Flock(int(fb.Fd()), unix.LOCK_EX|unix.LOCK_NB))
	})

	t.Run("readdir-10000", func(t *testing.T) {
		dir := filepath.Join(a, "big")
		must(t, os.Mkdir(dir, 0o755))
		st, _ := os.Stat(dir)
		ino := st.Sys().(*syscall.Stat_t).Ino
		const n = 10000
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 8 {
					if _, err := cb.Create(context.Background(), ino, fmt.Sprintf("entry-%05d", i), 0o644, 0, 0); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		f, err := os.Open(dir)
		must(t, err)
		names, err := f.Readdirnames(-1)
		f.Close()
		must(t, err)
		sort.Strings(names)
		if len(names) != n {
			t.Fatalf("listed %d entries, want %d", len(names), n)
		}
		for i := 1; i < len(names); i++ {
			if names[i] == names[i-1] {
				t.Fatalf("duplicate %s", names[i])
			}
		}
		ents, err := os.ReadDir(filepath.Join(b, "big")) // readdirplus on the other mount
		must(t, err)
		if len(ents) != n {
			t.Fatalf("other mount listed %d", len(ents))
		}
	})
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// asNobody runs a command as uid/gid 65534.
func asNobody(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var _ = client.RootIno

// The adapter's per-inode notes (what it told the kernel: size and mtime
// for keep-cache, st_blocks) go when the kernel forgets the inode: a scan
// of many files must not leave one entry per file in the daemon.
func TestForgetDropsInodeNotes(t *testing.T) {
	requireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to make the kernel evict inodes (drop_caches)")
	}
	tc := startCluster(t, 1, 1)
	dir, _ := tc.mount(nil)
	fs := tc.mounts[0].fs
	const n = 300
	for i := 0; i < n; i++ {
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), []byte("x"), 0o644))
	}
	// Held open, the files' inodes stay in the kernel even if another test
	// of the suite drops caches meanwhile (a lookup after such a drop makes
	// the notes anew).
	open := make([]*os.File, 0, n)
	for i := 0; i < n; i++ {
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("f%d", i)))
		must(t, err)
		open = append(open, f)
	}
	// OFD locks on some of them, taken and left to the close: the owners
	// the adapter noted for them must go with the inodes too.
	const locked = 30
	for _, f := range open[:locked] {
		lk := unix.Flock_t{Type: unix.F_RDLCK}
		must(t, unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk))
	}
	owners := func() int {
		fs.lockMu.Lock()
		defer fs.lockMu.Unlock()
		return len(fs.lockOwners)
	}
	r, b := fs.notes.count()
	o := owners()
	for _, f := range open {
		f.Close()
	}
	if r < n || b < n || o < locked {
		t.Fatalf("with %d files open, %d locked: %d keep-cache notes, %d block notes, lock owners on %d files", n, locked, r, b, o)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		unix.Sync()
		must(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0o644))
		r, b := fs.notes.count()
		o := owners()
		if r < n/10 && b < n/10 && o < locked/10 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the kernel dropped its inodes: %d keep-cache notes, %d block notes remain of %d, lock owners on %d of %d files", r, b, n, o, locked)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// copy_file_range is served by the daemon (not the kernel's page-by-page
// fallback): unaligned ranges across stripe units and files, a copy that
// meets the source's end, one within a file, and data still buffered in
// the source's handle.
func TestCopyFileRange(t *testing.T) {
	requireFUSE(t)
	tc := startCluster(t, 2, 2)
	dir, c := tc.mount(nil)
	src := filepath.Join(dir, "src")
	data := pattern(7, 5<<20+333)
	must(t, os.WriteFile(src, data, 0o644))
	copyRange := func(from, to *os.File, offIn, offOut int64, n int) int {
		t.Helper()
		k, err := unix.CopyFileRange(int(from.Fd()), &offIn, int(to.Fd()), &offOut, n, 0)
		if err != nil {
			t.Fatalf("copy_file_range(%d → %d, %d bytes): %v", offIn, offOut, n, err)
		}
		return k
	}
	in, err := os.Open(src)
	must(t, err)
	defer in.Close()
	out, err := os.Create(filepath.Join(dir, "dst"))
	must(t, err)
	if k := copyRange(in, out, 123457, 77, 3<<20); k != 3<<20 {
		t.Fatalf("copied %d bytes, want %d", k, 3<<20)
	}
	// Past the source's end: what is there.
	if k := copyRange(in, out, int64(len(data))-1000, 4<<20, 1<<20); k != 1000 {
		t.Fatalf("copy at the source's end: %d bytes, want 1000", k)
	}
	if k := copyRange(in, out, int64(len(data)), 0, 100); k != 0 {
		t.Fatalf("copy from the source's end: %d bytes, want 0", k)
	}
	must(t, out.Close())
	got, err := os.ReadFile(filepath.Join(dir, "dst"))
	must(t, err)
	want := make([]byte, 4<<20+1000)
	copy(want[77:], data[123457:123457+3<<20])
	copy(want[4<<20:], data[len(data)-1000:])
	if !bytes.Equal(got, want) {
		t.Fatalf("destination differs (len %d, want %d)", len(got), len(want))
	}
	// Within one file, from data this handle has only buffered so far.
	rw, err := os.OpenFile(filepath.Join(dir, "self"), os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer rw.Close()
	head := pattern(9, 1<<20)
	_, err = rw.WriteAt(head, 0)
	must(t, err)
	if k := copyRange(rw, rw, 0, 3<<20, 1<<20); k != 1<<20 {
		t.Fatalf("copy within a file: %d bytes", k)
	}
	must(t, rw.Sync())
	back := make([]byte, 1<<20)
	_, err = rw.ReadAt(back, 3<<20)
	must(t, err)
	if !bytes.Equal(back, head) {
		t.Fatal("copy within a file differs")
	}
	// Served here: the client counted the copies.
	mfs, err := c.Registry().Gather()
	must(t, err)
	served := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "strata_client_ops_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == "copy_file_range" {
					served += m.GetCounter().GetValue()
				}
			}
		}
	}
	// (The copy from the source's end is answered by the kernel itself.)
	if served < 3 {
		t.Fatalf("the daemon served %v copy_file_range calls, want 3 (the kernel's fallback did the rest)", served)
	}
}
