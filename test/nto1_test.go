package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/testutil"
)

const (
	nto1Writers = 8
	nto1Rounds  = 6 // each writer writes 6 blocks of 1 MiB: blocks w, w+8, w+16, …
	nto1Block   = 1 << 20
)

// nto1Pattern is the content of block b of the shared file.
func nto1Pattern(b int) []byte {
	out := make([]byte, nto1Block)
	for i := 0; i < nto1Block; i += 8 {
		copy(out[i:], fmt.Sprintf("%07x", b*nto1Block+i)[:7])
		out[i+7] = byte(b)
	}
	return out
}

// nto1Worker is a separate process writing its strided blocks.
func nto1Worker() int {
	path := os.Getenv("STRATA_NTO1_FILE")
	w, _ := strconv.Atoi(os.Getenv("STRATA_NTO1_RANK"))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Highest block first, so that the size is set by the writer that is not last.
	for r := nto1Rounds - 1; r >= 0; r-- {
		b := r*nto1Writers + w
		if _, err := f.WriteAt(nto1Pattern(b), int64(b)*nto1Block); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if err := f.Sync(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := f.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestNTo1TwoMounts: 8 processes on 2 mounts write disjoint 1 MiB-strided
// blocks of one file; the result is byte-exact with the right size, seen
// from both mounts.
func TestNTo1TwoMounts(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 2, TargetsPerStore: 2, Mounts: 2})
	name := "shared.dat"
	if err := os.WriteFile(filepath.Join(c.Mount(0), name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var procs []*exec.Cmd
	for w := 0; w < nto1Writers; w++ {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "STRATA_TEST_WORKER=nto1",
			"STRATA_NTO1_FILE="+filepath.Join(c.Mount(w%2), name), "STRATA_NTO1_RANK="+strconv.Itoa(w))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	for _, p := range procs {
		done := make(chan error, 1)
		go func() { done <- p.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("writer: %v", err)
			}
		case <-time.After(120 * time.Second):
			p.Process.Kill()
			t.Fatal("writer hung")
		}
	}
	wantSize := int64(nto1Writers * nto1Rounds * nto1Block)
	for m := 0; m < 2; m++ {
		data, err := os.ReadFile(filepath.Join(c.Mount(m), name))
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(data)) != wantSize {
			t.Fatalf("mount %d: size %d, want %d", m, len(data), wantSize)
		}
		for b := 0; b < nto1Writers*nto1Rounds; b++ {
			if !bytes.Equal(data[b*nto1Block:(b+1)*nto1Block], nto1Pattern(b)) {
				t.Fatalf("mount %d: block %d differs", m, b)
			}
		}
	}
}
