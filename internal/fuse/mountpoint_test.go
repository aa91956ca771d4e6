package fuse

import "testing"

func TestTopMount(t *testing.T) {
	if _, ok, err := topMount("/"); err != nil || !ok {
		t.Fatalf("root: mounted %v, %v", ok, err)
	}
	if typ, ok, err := topMount(t.TempDir()); err != nil || ok {
		t.Fatalf("a fresh temporary directory is a mount point (%s)? %v", typ, err)
	}
}
