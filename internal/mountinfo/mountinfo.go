// Package mountinfo reads the kernel's table of this process's mounts
// (/proc/self/mountinfo): what the benchmark reports as the file system
// under a directory, and what the mount command checks before mounting.
// It also tells a Strata mount from others (OnStrata: statfs and the
// table agree) and keeps the runtime records of the running mount daemons
// (Record), through which the admin commands find a cluster and a refused
// mount point names the process serving it.
package mountinfo

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of the table.
type Mount struct {
	Point  string // where it is mounted (unescaped)
	FSType string // e.g. "ext4", "fuse.strata"
	Source string // e.g. "/dev/vda", "strata"
}

// Read returns the mounts in the kernel's order: a later mount at a point
// lies over earlier ones.
func Read() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var out []Mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, fl := range fields {
			if fl == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, Mount{Point: Unescape(fields[4]), FSType: fields[sep+1], Source: fields[sep+2]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return out, nil
}

// Unescape undoes the octal escapes (\040 for a space, …) of paths in the
// table.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
