package bench

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stratafs/strata/internal/passthrough"
)

// corruptFile is a FUSE test double: a loopback file whose reads come back
// with one byte flipped at flipOffset.
type corruptFile struct {
	*passthrough.File
}

const flipOffset = 3<<20 + 777

func (f *corruptFile) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	res, errno := f.File.Read(ctx, buf, off)
	if errno != 0 {
		return nil, errno
	}
	b, st := res.Bytes(buf)
	res.Done()
	if !st.Ok() {
		return nil, syscall.Errno(st)
	}
	if flipOffset >= off && flipOffset < off+int64(len(b)) {
		b[flipOffset-off] ^= 0x01
	}
	return fuse.ReadResultData(b), 0
}

func TestCorruptingFileSystemFailsTheRun(t *testing.T) {
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		t.Skipf("/dev/fuse unusable: %v", err)
	} else {
		f.Close()
	}
	src, mnt := t.TempDir(), t.TempDir()
	srv, err := passthrough.Mount(src, mnt, &passthrough.Options{
		Name: "corrupt",
		WrapFile: func(lf *fs.LoopbackFile) fs.FileHandle {
			return &corruptFile{File: passthrough.NewFile(lf)}
		},
	})
	if err != nil {
		t.Skipf("cannot mount FUSE: %v", err)
	}
	defer srv.Unmount()

	c := testConfig(t, mnt)
	c.Workloads = []string{"seq"}
	c.Threads = []int{1}
	c.Fio = false
	_, err = Run(context.Background(), c)
	if err == nil {
		t.Fatal("a file system that flips a byte passed verification")
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("error is not a verification failure: %v", err)
	}
	if !strings.Contains(err.Error(), "offset 3146505") || !strings.Contains(err.Error(), "seq.0") {
		t.Fatalf("error does not name the file and offset: %v", err)
	}
	t.Logf("run failed as it must: %v", err)
}
