package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/testutil"
)

// TestPOSIXOnStrata runs the POSIX suite on a Strata FUSE mount, with a
// second mount of the same cluster for the cross-mount checks.
func TestPOSIXOnStrata(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2, Mounts: 2})
	runPOSIXSuite(t, c.Mount(0), c.Mount(1), c.Dir)
}

// runPOSIXSuite checks POSIX behaviour on root (a mounted file system).
// other, if not "", is a second mount of the same file system; dataDir,
// if not "", holds the cluster's targets (to see that data is freed).
func runPOSIXSuite(t *testing.T, root, other, dataDir string) {
	runPOSIXSuiteSkipping(t, root, other, dataDir, nil)
}

// runPOSIXSuiteSkipping is runPOSIXSuite with the sub-tests named in skip
// skipped, each with its reason: for a protocol that cannot give that
// behaviour (TestPOSIXOnNFS), never for a bug.
func runPOSIXSuiteSkipping(t *testing.T, root, other, dataDir string, skip map[string]string) {
	run := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			if why, ok := skip[name]; ok {
				t.Skip(why)
			}
			f(t)
		})
	}
	sub := func(name string, f func(t *testing.T, dir string)) {
		run(name, func(t *testing.T) {
			dir := filepath.Join(root, name)
			if err := os.Mkdir(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			f(t, dir)
		})
	}
	sub("modes", func(t *testing.T, dir string) {
		for _, mode := range []os.FileMode{0, 0o600, 0o644, 0o755, 0o777} {
			p := filepath.Join(dir, fmt.Sprintf("m%o", mode))
			fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, uint32(mode))
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			// The test process's umask (022 typically) applies once, in the kernel.
			want := mode &^ os.FileMode(currentUmask())
			if st.Mode().Perm() != want {
				t.Errorf("created %o: stat shows %o, want %o", mode, st.Mode().Perm(), want)
			}
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
			st, _ = os.Stat(p)
			if st.Mode().Perm() != mode {
				t.Errorf("chmod %o: stat shows %o", mode, st.Mode().Perm())
			}
		}
	})
	sub("readwrite", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "f")
		data := make([]byte, 3<<20+17)
		for i := range data {
			data[i] = byte(i ^ i>>9)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte("patch"), 1<<20-2); err != nil {
			t.Fatal(err)
		}
		copy(data[1<<20-2:], "patch")
		got := make([]byte, len(data))
		if _, err := f.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("read after overwrite differs")
		}
		// Append mode.
		af, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		af.Write([]byte("tail"))
		af.Close()
		st, _ := os.Stat(p)
		if st.Size() != int64(len(data))+4 {
			t.Fatalf("append: size %d", st.Size())
		}
	})
	sub("sparse_and_large", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "sparse")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		off := int64(5) << 30 // beyond 4 GiB
		if _, err := f.WriteAt([]byte("end"), off); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		if st.Size() != off+3 {
			t.Fatalf("size %d", st.Size())
		}
		buf := make([]byte, 8192)
		for _, at := range []int64{0, 1 << 20, 4<<30 - 100, off - 8192} {
			if _, err := f.ReadAt(buf, at); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf, make([]byte, 8192)) {
				t.Fatalf("hole at %d not zero", at)
			}
		}
		tail := make([]byte, 3)
		f.ReadAt(tail, off)
		if string(tail) != "end" {
			t.Fatalf("tail %q", tail)
		}
	})
	sub("truncate", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "t")
		os.WriteFile(p, bytes.Repeat([]byte("a"), 3<<20), 0o644)
		if err := os.Truncate(p, 1000); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 2<<20); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(p)
		if len(got) != 2<<20 || !bytes.Equal(got[:1000], bytes.Repeat([]byte("a"), 1000)) || !bytes.Equal(got[1000:], make([]byte, 2<<20-1000)) {
			t.Fatal("truncate down then up: bytes after the cut must read as zeros")
		}
	})
	sub("rename_flags", func(t *testing.T, dir string) {
		a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
		os.WriteFile(a, []byte("A"), 0o644)
		os.WriteFile(b, []byte("B"), 0o644)
		if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_NOREPLACE); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("RENAME_NOREPLACE: %v", err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
			t.Fatalf("RENAME_EXCHANGE: %v", err)
		}
		if x, _ := os.ReadFile(a); string(x) != "B" {
			t.Errorf("after exchange a=%q", x)
		}
		if x, _ := os.ReadFile(b); string(x) != "A" {
			t.Errorf("after exchange b=%q", x)
		}
	})
	sub("rename", func(t *testing.T, dir string) {
		a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
		os.WriteFile(a, []byte("B"), 0o644)
		os.WriteFile(b, []byte("A"), 0o644)
		if err := os.Rename(a, b); err != nil { // replacing
			t.Fatal(err)
		}
		if x, _ := os.ReadFile(b); string(x) != "B" {
			t.Errorf("after replace b=%q", x)
		}
		if _, err := os.Stat(a); !os.IsNotExist(err) {
			t.Errorf("a still exists")
		}
		// Across directories, and a directory into its own subtree.
		os.MkdirAll(filepath.Join(dir, "d1", "d2"), 0o755)
		if err := os.Rename(b, filepath.Join(dir, "d1", "d2", "b")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "d1"), filepath.Join(dir, "d1", "d2", "d3")); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("dir into own subtree: %v", err)
		}
		os.Mkdir(filepath.Join(dir, "full"), 0o755)
		os.WriteFile(filepath.Join(dir, "full", "x"), nil, 0o644)
		os.Mkdir(filepath.Join(dir, "empty"), 0o755)
		// syscall.Rename: Go's os.Rename refuses any existing directory target itself.
		if err := syscall.Rename(filepath.Join(dir, "empty"), filepath.Join(dir, "full")); !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
			t.Errorf("onto non-empty dir: %v", err)
		}
		if err := syscall.Rename(filepath.Join(dir, "full"), filepath.Join(dir, "empty")); err != nil {
			t.Errorf("dir onto empty dir: %v", err)
		}
	})
	sub("links", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "orig")
		os.WriteFile(p, []byte("data"), 0o644)
		if err := os.Link(p, filepath.Join(dir, "hard")); err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(p)
		if n := st.Sys().(*syscall.Stat_t).Nlink; n != 2 {
			t.Errorf("nlink %d", n)
		}
		os.Remove(p)
		if x, err := os.ReadFile(filepath.Join(dir, "hard")); err != nil || string(x) != "data" {
			t.Errorf("via hard link after unlink: %q %v", x, err)
		}
		if err := os.Symlink("hard", filepath.Join(dir, "sym")); err != nil {
			t.Fatal(err)
		}
		if tgt, err := os.Readlink(filepath.Join(dir, "sym")); err != nil || tgt != "hard" {
			t.Errorf("readlink %q %v", tgt, err)
		}
		if x, err := os.ReadFile(filepath.Join(dir, "sym")); err != nil || string(x) != "data" {
			t.Errorf("through symlink %q %v", x, err)
		}
		os.Mkdir(filepath.Join(dir, "sub"), 0o755)
		if err := os.Link(filepath.Join(dir, "sub"), filepath.Join(dir, "sublink")); !errors.Is(err, syscall.EPERM) {
			t.Errorf("hard link to dir: %v", err)
		}
		dst, _ := os.Stat(dir)
		if n := dst.Sys().(*syscall.Stat_t).Nlink; n != 3 { // ".", parent entry, sub/..
			t.Errorf("dir nlink %d, want 3", n)
		}
	})
	sub("errors", func(t *testing.T, dir string) {
		os.Mkdir(filepath.Join(dir, "d"), 0o755)
		os.WriteFile(filepath.Join(dir, "d", "x"), nil, 0o644)
		os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
		check := func(what string, err, want error) {
			if !errors.Is(err, want) {
				t.Errorf("%s: got %v, want %v", what, err, want)
			}
		}
		check("rmdir non-empty", os.Remove(filepath.Join(dir, "d")), syscall.ENOTEMPTY)
		check("mkdir existing", os.Mkdir(filepath.Join(dir, "d"), 0o755), syscall.EEXIST)
		_, err := os.Open(filepath.Join(dir, "missing"))
		check("open missing", err, syscall.ENOENT)
		check("unlink dir", syscall.Unlink(filepath.Join(dir, "d")), syscall.EISDIR)
		check("rmdir file", syscall.Rmdir(filepath.Join(dir, "f")), syscall.ENOTDIR)
		_, err = os.Stat(filepath.Join(dir, "f", "x"))
		check("file as dir", err, syscall.ENOTDIR)
		_, err = os.OpenFile(filepath.Join(dir, "f"), os.O_CREATE|os.O_EXCL, 0o644)
		check("O_EXCL existing", err, syscall.EEXIST)
	})
	sub("readdir", func(t *testing.T, dir string) {
		const n = 3000
		want := make([]string, 0, n)
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("entry-%05d", i)
			want = append(want, name)
			fd, err := unix.Open(filepath.Join(dir, name), unix.O_CREAT|unix.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		sort.Strings(got)
		if len(got) != n {
			t.Fatalf("readdir: %d entries, want %d", len(got), n)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("entry %d: %q want %q", i, got[i], want[i])
			}
		}
	})
	sub("xattr", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "x")
		os.WriteFile(p, nil, 0o644)
		if err := unix.Setxattr(p, "user.k", []byte("v1"), 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(p, "user.k", []byte("v2"), unix.XATTR_CREATE); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("XATTR_CREATE existing: %v", err)
		}
		if err := unix.Setxattr(p, "user.none", []byte("v"), unix.XATTR_REPLACE); !errors.Is(err, syscall.ENODATA) {
			t.Errorf("XATTR_REPLACE missing: %v", err)
		}
		buf := make([]byte, 64)
		n, err := unix.Getxattr(p, "user.k", buf)
		if err != nil || string(buf[:n]) != "v1" {
			t.Errorf("getxattr %q %v", buf[:n], err)
		}
		if _, err := unix.Getxattr(p, "user.k", make([]byte, 1)); !errors.Is(err, syscall.ERANGE) {
			t.Errorf("small buffer: %v", err)
		}
		n, _ = unix.Listxattr(p, buf)
		if !bytes.Contains(buf[:n], []byte("user.k\x00")) {
			t.Errorf("listxattr %q", buf[:n])
		}
		if bytes.Contains(buf[:n], []byte("strata.layout")) {
			t.Errorf("listxattr shows the virtual layout attribute: %q", buf[:n])
		}
		unix.Removexattr(p, "user.k")
		if _, err := unix.Getxattr(p, "user.k", buf); !errors.Is(err, syscall.ENODATA) {
			t.Errorf("after remove: %v", err)
		}
	})
	sub("timestamps", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "ts")
		os.WriteFile(p, []byte("x"), 0o644)
		st0 := statT(t, p)
		time.Sleep(20 * time.Millisecond)
		os.WriteFile(p, []byte("xy"), 0o644) // write: mtime and ctime move
		st1 := statT(t, p)
		if !after(st1.Mtim, st0.Mtim) || !after(st1.Ctim, st0.Ctim) {
			t.Errorf("write did not advance mtime/ctime")
		}
		time.Sleep(20 * time.Millisecond)
		os.Chmod(p, 0o600) // chmod: ctime only
		st2 := statT(t, p)
		if st2.Mtim != st1.Mtim || !after(st2.Ctim, st1.Ctim) {
			t.Errorf("chmod: mtime %v→%v ctime %v→%v", st1.Mtim, st2.Mtim, st1.Ctim, st2.Ctim)
		}
		mt := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
		st3 := statT(t, p)
		if time.Unix(st3.Mtim.Unix()).UTC() != mt || time.Unix(st3.Atim.Unix()).UTC() != mt {
			t.Errorf("utimes: %v %v", st3.Mtim, st3.Atim)
		}
		d0 := statT(t, dir)
		time.Sleep(20 * time.Millisecond)
		os.WriteFile(filepath.Join(dir, "new"), nil, 0o644) // create: parent mtime/ctime
		d1 := statT(t, dir)
		if !after(d1.Mtim, d0.Mtim) || !after(d1.Ctim, d0.Ctim) {
			t.Errorf("create did not advance the parent's mtime/ctime")
		}
	})
	sub("unlinked_open", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "u")
		data := bytes.Repeat([]byte("keep"), 1<<18)
		os.WriteFile(p, data, 0o644)
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		got := make([]byte, len(data))
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read of unlinked open file: %v", err)
		}
	})
	sub("tmpfile", func(t *testing.T, dir string) {
		// O_TMPFILE: a file in no directory, readable and writable
		// through its descriptor, named by linkat unless O_EXCL was
		// given, and its data freed after the last close otherwise.
		fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR, 0o640)
		if err != nil {
			t.Fatalf("open O_TMPFILE: %v", err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		if want := uint32(0o640 &^ currentUmask()); st.Nlink != 0 || st.Mode != unix.S_IFREG|want {
			t.Fatalf("tmpfile: nlink %d mode %o, want 0 and %o", st.Nlink, st.Mode, unix.S_IFREG|want)
		}
		data := bytes.Repeat([]byte("tmpfile!"), 3<<17) // 3 MiB: several stripes
		if n, err := unix.Pwrite(fd, data, 0); err != nil || n != len(data) {
			t.Fatalf("write: %d %v", n, err)
		}
		got := make([]byte, len(data))
		if n, err := unix.Pread(fd, got, 0); err != nil || n != len(data) || !bytes.Equal(got, data) {
			t.Fatalf("read back: %d %v", n, err)
		}
		if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
			t.Fatalf("the directory lists %v (%v), want nothing", ents, err)
		}
		named := filepath.Join(dir, "named")
		if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, named, unix.AT_SYMLINK_FOLLOW); err != nil {
			t.Fatalf("linkat of the tmpfile: %v", err)
		}
		if err := unix.Fstat(fd, &st); err != nil || st.Nlink != 1 {
			t.Fatalf("after linkat: nlink %d, %v", st.Nlink, err)
		}
		unix.Close(fd)
		if x, err := os.ReadFile(named); err != nil || !bytes.Equal(x, data) {
			t.Fatalf("named tmpfile reads %d bytes, %v", len(x), err)
		}
		if other != "" {
			if x, err := os.ReadFile(filepath.Join(other, "tmpfile", "named")); err != nil || !bytes.Equal(x, data) {
				t.Fatalf("named tmpfile on the other mount reads %d bytes, %v", len(x), err)
			}
		}
		// O_EXCL: never to be named (the kernel refuses linkat).
		xfd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", xfd), unix.AT_FDCWD, filepath.Join(dir, "x"), unix.AT_SYMLINK_FOLLOW); !errors.Is(err, unix.ENOENT) {
			t.Errorf("linkat of an O_EXCL tmpfile: %v, want ENOENT", err)
		}
		if _, err := unix.Pwrite(xfd, data, 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fsync(xfd); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fstat(xfd, &st); err != nil {
			t.Fatal(err)
		}
		if dataDir != "" && chunkFiles(t, dataDir, st.Ino) == 0 {
			t.Fatalf("the open O_EXCL tmpfile (inode %d) has no chunk files after fsync", st.Ino)
		}
		unix.Close(xfd)
		if _, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDONLY, 0o600); !errors.Is(err, unix.EINVAL) {
			t.Errorf("O_TMPFILE read-only: %v, want EINVAL", err)
		}
		// Permission: another user cannot make one in a directory it may
		// not write.
		self := worldExecutableSelf(t)
		asNobodyTmpfile := func() string {
			w := exec.Command(self)
			w.Env = append(os.Environ(), "STRATA_TEST_WORKER=tmpfile", "TMPFILE_DIR="+dir)
			w.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			out, _ := w.CombinedOutput()
			return string(out)
		}
		os.Chmod(dir, 0o755)
		if out := asNobodyTmpfile(); out != "permission denied" {
			t.Errorf("O_TMPFILE by another user in a 0755 directory: %q, want permission denied", out)
		}
		os.Chmod(dir, 0o777)
		if out := asNobodyTmpfile(); out != "ok" {
			t.Errorf("O_TMPFILE by another user in a 0777 directory: %q, want ok", out)
		}
		if dataDir == "" {
			return
		}
		// The unnamed file's chunks go once no mount holds it open; the
		// named one's stay.
		if err := testutil.WaitFor(60*time.Second, func() error {
			if n := chunkFiles(t, dataDir, st.Ino); n != 0 {
				return fmt.Errorf("%d chunk files of the closed O_EXCL tmpfile (inode %d) remain", n, st.Ino)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		var nst unix.Stat_t
		if err := unix.Stat(named, &nst); err != nil {
			t.Fatal(err)
		}
		if n := chunkFiles(t, dataDir, nst.Ino); n == 0 {
			t.Errorf("the named tmpfile (inode %d) has no chunk files", nst.Ino)
		}
		if x, err := os.ReadFile(named); err != nil || !bytes.Equal(x, data) {
			t.Fatalf("named tmpfile after reaping reads %d bytes, %v", len(x), err)
		}
	})
	sub("seek_hole", func(t *testing.T, dir string) {
		// SEEK_DATA and SEEK_HOLE over a sparse file striped over every
		// target: data written across stripe units, a punched hole, a
		// hole at the end; asked on the writing handle before any fsync
		// (buffered writes count) and on the other mount after close.
		const K, M = 4096, 1 << 20
		p := filepath.Join(dir, "sparse")
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, w := range [][2]int64{{0, 8 * K}, {3*M - 4*K, 12 * K}, {9 * M, M + 4*K}} {
			if _, err := f.WriteAt(bytes.Repeat([]byte{0x5a}, int(w[1])), w[0]); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 9*M+64*K, 64*K); err != nil {
			t.Fatal(err)
		}
		const size = 16 * M
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		data := [][2]int64{{0, 8 * K}, {3*M - 4*K, 3*M + 8*K}, {9 * M, 9*M + 64*K}, {9*M + 128*K, 10*M + 4*K}}
		want := func(off int64, whence int) (int64, error) {
			if off >= size {
				return 0, unix.ENXIO
			}
			for _, d := range data {
				if off < d[1] {
					if whence == unix.SEEK_DATA {
						return max(off, d[0]), nil
					}
					if off >= d[0] {
						return d[1], nil
					}
					return off, nil
				}
			}
			if whence == unix.SEEK_DATA {
				return 0, unix.ENXIO
			}
			return off, nil
		}
		offs := []int64{size - 1, size, size + M}
		for o := int64(0); o < size; o += 64 * K {
			offs = append(offs, o)
		}
		for _, d := range data {
			offs = append(offs, d[0]-1, d[0], d[0]+1, d[1]-1, d[1], d[1]+1)
		}
		check := func(where string, fd int) {
			for _, o := range offs {
				if o < 0 {
					continue
				}
				for _, wh := range []int{unix.SEEK_DATA, unix.SEEK_HOLE} {
					got, err := unix.Seek(fd, o, wh)
					exp, expErr := want(o, wh)
					if err != expErr || (err == nil && got != exp) {
						t.Errorf("%s: lseek(%d, whence %d) = %d, %v; want %d, %v", where, o, wh, got, err, exp, expErr)
					}
				}
			}
		}
		check("writing handle", int(f.Fd()))
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if other != "" {
			g, err := os.Open(filepath.Join(other, "seek_hole", "sparse"))
			if err != nil {
				t.Fatal(err)
			}
			check("other mount", int(g.Fd()))
			g.Close()
		}
	})
	sub("blocks", func(t *testing.T, dir string) {
		// st_blocks is the space the chunks take, not the size: du and
		// sparse-aware copies (cp decides by st_blocks) see holes.
		const M = 1 << 20
		blocksOf := func(p string) int64 {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				t.Fatal(err)
			}
			return st.Blocks
		}
		// Right after the close: a commit that changed the space has the
		// kernel drop its cached attributes.
		checkBlocks := func(p string, ok func(int64) bool, what string) {
			t.Helper()
			if b := blocksOf(p); !ok(b) {
				t.Errorf("%s: %d blocks of 512 bytes", what, b)
			}
		}
		sparse := makeSparse(t, dir)
		checkBlocks(sparse, func(b int64) bool { return b*512 >= 10000 && b*512 < M }, "10,000 bytes in a 100 MiB file")
		dense := filepath.Join(dir, "dense")
		if err := os.WriteFile(dense, bytes.Repeat([]byte("d"), 8*M), 0o644); err != nil {
			t.Fatal(err)
		}
		checkBlocks(dense, func(b int64) bool { return b*512 >= 8*M && b*512 <= 9*M }, "an 8 MiB file written whole")
		if err := os.Truncate(dense, M); err != nil {
			t.Fatal(err)
		}
		checkBlocks(dense, func(b int64) bool { return b*512 >= M && b*512 <= 2*M }, "the 8 MiB file cut to 1 MiB")
	})
	sub("sparse_copy", func(t *testing.T, dir string) {
		// cp --sparse=auto keeps a sparse file's holes (it finds the data
		// with SEEK_DATA, or zeros in pieces of st_blksize).
		const M = 1 << 20
		cp, err := exec.LookPath("cp")
		if err != nil {
			t.Skip("no cp")
		}
		sparse := makeSparse(t, dir)
		cp2 := filepath.Join(dir, "copy")
		if out, err := exec.Command(cp, "--sparse=auto", sparse, cp2).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		a, _ := os.ReadFile(sparse)
		b, _ := os.ReadFile(cp2)
		if !bytes.Equal(a, b) {
			t.Fatal("cp --sparse=auto copy differs")
		}
		var st unix.Stat_t
		if err := unix.Stat(cp2, &st); err != nil {
			t.Fatal(err)
		}
		if st.Blocks*512 >= M {
			t.Errorf("cp --sparse=auto copy of the sparse file: %d blocks of 512 bytes", st.Blocks)
		}
	})
	sub("mmap", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "mm")
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		f.Truncate(1 << 20)
		m, err := unix.Mmap(int(f.Fd()), 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		copy(m[4096:], "mapped write")
		if err := unix.Msync(m, unix.MS_SYNC); err != nil {
			t.Fatal(err)
		}
		unix.Munmap(m)
		f.Close()
		got, _ := os.ReadFile(p)
		if !bytes.Equal(got[4096:4096+12], []byte("mapped write")) {
			t.Fatalf("mmap write not visible: %q", got[4096:4108])
		}
	})
	sub("odirect", func(t *testing.T, dir string) {
		p := filepath.Join(dir, "od")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		buf := alignedBuf(1 << 20)
		for i := range buf {
			buf[i] = byte(i * 13)
		}
		if _, err := unix.Pwrite(fd, buf, 4096); err != nil {
			t.Fatal(err)
		}
		rb := alignedBuf(1 << 20)
		if _, err := unix.Pread(fd, rb, 4096); err != nil || !bytes.Equal(rb, buf) {
			t.Fatalf("O_DIRECT read back: %v", err)
		}
		if err := unix.Fsync(fd); err != nil {
			t.Fatal(err)
		}
	})
	sub("permissions", func(t *testing.T, dir string) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to switch users")
		}
		p := filepath.Join(dir, "secret")
		os.WriteFile(p, []byte("s"), 0o600)
		out, err := asNobody("cat", p)
		if err == nil || !bytes.Contains(out, []byte("Permission denied")) {
			t.Errorf("nobody read a 0600 root file: %v %s", err, out)
		}
		pub := filepath.Join(dir, "public")
		os.WriteFile(pub, []byte("p"), 0o644)
		if out, err := asNobody("cat", pub); err != nil || string(out) != "p" {
			t.Errorf("nobody cannot read a 0644 file: %v %s", err, out)
		}
		// setuid is cleared when a non-owner writes. (unix.Chmod: os.Chmod
		// takes os.FileMode, whose setuid is not 0o4000.)
		sf := filepath.Join(dir, "suid")
		os.WriteFile(sf, []byte("x"), 0o777)
		setuid := func(mode uint32) {
			t.Helper()
			if err := unix.Chmod(sf, mode); err != nil {
				t.Fatal(err)
			}
			if st, _ := os.Stat(sf); st.Mode()&os.ModeSetuid == 0 {
				t.Fatalf("chmod %o: %v", mode, st.Mode())
			}
		}
		setuid(0o4777)
		if out, err := asNobody("sh", "-c", "echo y >> "+sf); err != nil {
			t.Fatalf("nobody append: %v %s", err, out)
		}
		if st, _ := os.Stat(sf); st.Mode()&os.ModeSetuid != 0 {
			t.Errorf("setuid kept after write by another user: %v", st.Mode())
		}
		// chown clears setuid.
		setuid(0o4755)
		os.Chown(sf, 65534, 65534)
		if st, _ := os.Stat(sf); st.Mode()&os.ModeSetuid != 0 {
			t.Errorf("setuid kept after chown: %v", st.Mode())
		}
	})
	if other != "" {
		run("close_to_open", func(t *testing.T) {
			p := filepath.Join(root, "cto")
			os.WriteFile(p, []byte("version one"), 0o644)
			q := filepath.Join(other, "cto")
			if x, err := os.ReadFile(q); err != nil || string(x) != "version one" {
				t.Fatalf("other mount: %q %v", x, err)
			}
			os.WriteFile(p, []byte("version two, longer"), 0o644)
			if x, err := os.ReadFile(q); err != nil || string(x) != "version two, longer" {
				t.Fatalf("other mount after rewrite: %q %v", x, err)
			}
		})
		run("locks_across_mounts", func(t *testing.T) {
			p := filepath.Join(root, "lockfile")
			os.WriteFile(p, nil, 0o644)
			for _, kind := range []string{"flock", "fcntl"} {
				holder := exec.Command(os.Args[0])
				holder.Env = append(os.Environ(), "STRATA_TEST_WORKER=lock", "LOCK_KIND="+kind, "LOCK_FILE="+p, "LOCK_HOLD=1")
				stdout, _ := holder.StdoutPipe()
				if err := holder.Start(); err != nil {
					t.Fatal(err)
				}
				ready := make([]byte, 6)
				if _, err := stdout.Read(ready); err != nil || string(ready) != "locked" {
					holder.Process.Kill()
					t.Fatalf("%s holder: %q %v", kind, ready, err)
				}
				try := exec.Command(os.Args[0])
				try.Env = append(os.Environ(), "STRATA_TEST_WORKER=lock", "LOCK_KIND="+kind, "LOCK_FILE="+filepath.Join(other, "lockfile"), "LOCK_HOLD=0")
				out, _ := try.CombinedOutput()
				if string(out) != "busy" {
					t.Errorf("%s: second mount got %q while the lock is held, want busy", kind, out)
				}
				holder.Process.Kill() // the holder dies: its lock must go
				holder.Wait()
				if err := testutil.WaitFor(30*time.Second, func() error {
					try := exec.Command(os.Args[0])
					try.Env = append(os.Environ(), "STRATA_TEST_WORKER=lock", "LOCK_KIND="+kind, "LOCK_FILE="+filepath.Join(other, "lockfile"), "LOCK_HOLD=0")
					o, _ := try.CombinedOutput()
					if string(o) != "locked" {
						return fmt.Errorf("got %q", o)
					}
					return nil
				}); err != nil {
					t.Errorf("%s: lock of a killed holder not released: %v", kind, err)
				}
			}
		})
	}
}

// lockWorker takes a lock on LOCK_FILE without waiting and prints "locked"
// or "busy"; with LOCK_HOLD=1 it then holds it until killed.
func lockWorker() int {
	f, err := os.OpenFile(os.Getenv("LOCK_FILE"), os.O_RDWR, 0)
	if err != nil {
		fmt.Print("error: ", err)
		return 1
	}
	switch os.Getenv("LOCK_KIND") {
	case "flock":
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	default:
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
		err = unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk)
	}
	if errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) {
		fmt.Print("busy")
		return 0
	}
	if err != nil {
		fmt.Print("error: ", err)
		return 1
	}
	fmt.Print("locked")
	if os.Getenv("LOCK_HOLD") == "1" {
		time.Sleep(5 * time.Minute)
	}
	return 0
}

// tmpfileWorker opens an O_TMPFILE file in TMPFILE_DIR and prints "ok" or
// the error.
func tmpfileWorker() int {
	fd, err := unix.Open(os.Getenv("TMPFILE_DIR"), unix.O_TMPFILE|unix.O_RDWR, 0o600)
	if err != nil {
		fmt.Print(err)
		return 1
	}
	unix.Close(fd)
	fmt.Print("ok")
	return 0
}

// worldExecutableSelf copies the test binary where any user may run it
// (go test builds it in a directory only its owner may enter).
func worldExecutableSelf(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "strata-test-bin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "worker")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// chunkFiles counts the chunk data files of inode ino under dir (the
// targets' layout: chunks/XX/YY/<ino in hex>.data, XX and YY chosen by the
// target's format version).
func chunkFiles(t *testing.T, dir string, ino uint64) int {
	t.Helper()
	name := fmt.Sprintf("%016x.data", ino)
	n := 0
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == name && filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(p)))) == "chunks" {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return n
}

// makeSparse makes dir/sparse: 10,000 bytes at 5 MiB in a 100 MiB file.
func makeSparse(t *testing.T, dir string) string {
	t.Helper()
	const M = 1 << 20
	p := filepath.Join(dir, "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte("s"), 10000), 5*M); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(100 * M); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func asNobody(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd.CombinedOutput()
}

func statT(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func after(a, b syscall.Timespec) bool { return a.Nano() > b.Nano() }

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptrOf(b)%4096)
	if off == 4096 {
		off = 0
	}
	return b[off : off+n]
}

func currentUmask() int {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return m
}
