package passthrough

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
)

func TestFileHasNoPassthroughFd(t *testing.T) {
	var fh fs.FileHandle = NewFile(nil)
	if _, ok := fh.(fs.FilePassthroughFder); ok {
		t.Fatal("File implements FilePassthroughFder: the kernel would bypass the daemon")
	}
	if _, ok := fh.(fs.FileReader); !ok {
		t.Fatal("File does not implement FileReader")
	}
}

func TestMountRoundTrip(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	src, mnt := t.TempDir(), t.TempDir()
	srv, err := Mount(src, mnt, &Options{AllowOther: os.Geteuid() == 0})
	if err != nil {
		t.Skipf("cannot mount FUSE here: %v", err)
	}
	defer srv.Unmount()
	want := bytes.Repeat([]byte("strata"), 300000)
	if err := os.WriteFile(filepath.Join(mnt, "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "f"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back through the mount: %v, equal=%v", err, bytes.Equal(got, want))
	}
	back, err := os.ReadFile(filepath.Join(src, "f"))
	if err != nil || !bytes.Equal(back, want) {
		t.Fatalf("backing file differs: %v", err)
	}
}
