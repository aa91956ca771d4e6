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

// lockDataDir takes the data directory dir for this process, or says which
// process has it. The lock goes with the process (also on kill -9): the
// returned file only needs closing on a clean stop.
func lockDataDir(dir string) (*os.File, error) {
	p := filepath.Join(dir, dataLockName)
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
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
