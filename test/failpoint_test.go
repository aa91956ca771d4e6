package test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/testutil"
)

// restartMeta (re)starts the cluster's metadata service with spec in
// STRATA_FAILPOINTS ("" for none) and waits until it answers.
func restartMeta(t *testing.T, c *testutil.ProcCluster, spec string) {
	t.Helper()
	if spec != "" {
		os.Setenv(failpoint.EnvVar, spec)
		defer os.Unsetenv(failpoint.EnvVar)
	}
	c.Meta = testutil.StartProc(t, c.Dir, "meta", nil, c.Bin, c.Meta.Args...)
	if err := testutil.WaitFor(30*time.Second, func() error {
		if c.Meta.Exited() {
			return errors.New("meta exited:\n" + c.Meta.Tail(20))
		}
		_, err := c.Status()
		return err
	}); err != nil {
		t.Fatalf("metadata service (failpoints %q) did not come up: %v", spec, err)
	}
}

// TestCreateExactlyOnceAcrossCrash kills the metadata service (a single
// voter) at each durable step of a create — before the FSM applies it,
// after it applied it, and after the answer is known but before the reply
// — with the failpoint's SIGKILL of itself. The mount's client retries the
// same request (same client id and sequence number) on the restarted
// service: the create succeeds (no EEXIST), and exactly one file exists.
func TestCreateExactlyOnceAcrossCrash(t *testing.T) {
	for _, point := range []string{"meta/before-apply/create", "meta/after-apply/create", "meta/before-reply/create"} {
		t.Run(strings.ReplaceAll(point, "/", "-"), func(t *testing.T) {
			c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1})
			// No create before the one under test: the FSM's points
			// fire for entries replayed at start too, and a mkdir is a
			// create.
			dir := c.Mount(0)
			if err := c.Meta.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			restartMeta(t, c, point+"=1*exit")
			crashed := c.Meta

			created := make(chan error, 1)
			go func() {
				fd, err := unix.Open(filepath.Join(dir, "f"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
				if err == nil {
					err = unix.Close(fd)
				}
				created <- err
			}()
			werr, ended := crashed.Wait(30 * time.Second)
			if !ended {
				t.Fatalf("metadata service still running 30 s after the create reached %s", point)
			}
			var ee interface{ Sys() any }
			if !errors.As(werr, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("metadata service ended with %v, want killed by its failpoint", werr)
			}
			if !strings.Contains(crashed.Tail(5), "failpoint "+point+": killing") {
				t.Fatalf("metadata service log does not show the failpoint firing:\n%s", crashed.Tail(10))
			}
			select {
			case err := <-created:
				t.Fatalf("create answered (%v) while the metadata service was down", err)
			default:
			}
			restartMeta(t, c, "")
			select {
			case err := <-created:
				if err != nil {
					t.Fatalf("create across the crash at %s: %v (want success: the retry is the same request)", point, err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("create did not complete 60 s after the restart")
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 1 || ents[0].Name() != "f" {
				t.Fatalf("directory holds %v, want exactly f", ents)
			}
			if _, err := unix.Open(filepath.Join(dir, "f"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); !errors.Is(err, unix.EEXIST) {
				t.Fatalf("a new create of f: %v, want EEXIST", err)
			}
		})
	}
}

// TestReplyErrorAfterCreate: a failpoint's error action before the reply
// of a create answers the client EIO although the create was made — the
// "unknown outcome" the history checker allows for; the file exists once,
// and the service serves on.
func TestReplyErrorAfterCreate(t *testing.T) {
	c := testutil.StartProcCluster(t, testutil.ProcOptions{Stores: 1, TargetsPerStore: 1})
	if err := c.Meta.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	restartMeta(t, c, "meta/before-reply/create=1*error")
	path := filepath.Join(c.Mount(0), "f")
	_, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if !errors.Is(err, unix.EIO) {
		t.Fatalf("create at an armed error point: %v, want EIO", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the create answered EIO was made, yet: %v", err)
	}
	fd, err := unix.Open(filepath.Join(c.Mount(0), "g"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("the next create (the point fires once): %v", err)
	}
	unix.Close(fd)
}
