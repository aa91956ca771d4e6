package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// dataLockName is the file in a data directory that a running strata holds
// an exclusive lock on (with its pid inside, for the message to the next).
const dataLockName = "strata.lock"

// dataLock is a data directory taken by this process.
type dataLock struct {
	f    *os.File
	path string
}

// lockDataDir takes the data directory dir for this process, or says which
// process has it. The lock goes with the process (also on kill -9); release
// removes the file on every stop, refused or clean.
//
// Removing a lock file races with a process that opened it just before
// and locks it just after: it would hold a lock on a file no longer in the
// directory while a third creates a new one. So a lock counts only if the
// path still names the file locked; else the lock is taken again.
func lockDataDir(dir string) (*dataLock, error) {
	p := filepath.Join(dir, dataLockName)
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("lock data directory: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			defer f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				holder := "another process"
				if b, rerr := os.ReadFile(p); rerr == nil {
					if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
						holder = fmt.Sprintf("another strata (pid %d)", pid)
					}
				}
				return nil, fmt.Errorf("data directory %s is in use by %s: stop it first, or use another --data", dir, holder)
			}
			return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
		}
		var held, named unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(p, &named) == nil && held.Ino == named.Ino && held.Dev == named.Dev {
			if err := f.Truncate(0); err == nil {
				_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			}
			return &dataLock{f: f, path: p}, nil
		}
		f.Close() // removed by its last holder while we waited: take the new one
		if attempt == 10 {
			return nil, fmt.Errorf("lock data directory %s: %s keeps being replaced", dir, p)
		}
	}
}

// release removes the lock file and lets the lock go.
func (l *dataLock) release() {
	os.Remove(l.path)
	l.f.Close()
}
