package mountinfo

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// FSType is the type Strata mounts show in the table (FUSE prefixes the
// name of the mount options with "fuse.").
const FSType = "fuse.strata"

// SourcePrefix starts the source of a Strata mount: "strata@ADDR" or
// "strata@A,B,C" names the metadata service's addresses (its voters) the
// mount was started with (df shows it).
const SourcePrefix = "strata@"

// fuseSuperMagic is statfs's f_type of every FUSE file system.
const fuseSuperMagic = 0x65735546

// Source is the mount source that a Strata mount of the cluster whose
// metadata service is at metaAddr (one address or a comma-separated list)
// shows.
func Source(metaAddr string) string { return SourcePrefix + metaAddr }

// MetaAddr returns the metadata address (or comma-separated list of them)
// a Strata mount's source names.
func (m Mount) MetaAddr() (string, bool) {
	if m.FSType != FSType || !strings.HasPrefix(m.Source, SourcePrefix) {
		return "", false
	}
	a := strings.TrimPrefix(m.Source, SourcePrefix)
	return a, a != ""
}

// Containing returns the uppermost mount that path (made absolute, its
// symlinks resolved) lies on.
func Containing(path string) (Mount, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return Mount{}, err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	ms, err := Read()
	if err != nil {
		return Mount{}, err
	}
	var best Mount
	found := false
	for _, m := range ms {
		if under(abs, m.Point) && (!found || len(m.Point) >= len(best.Point)) {
			best, found = m, true // later lines lie over earlier ones
		}
	}
	if !found {
		return Mount{}, fmt.Errorf("no mount holds %s", abs)
	}
	return best, nil
}

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// OnStrata returns the Strata mount that path lies on; ok is false when
// path is on another file system. Both the kernel (statfs: a FUSE file
// system) and the mount table (type fuse.strata) must agree, so that a
// FUSE file system of another kind is never taken for Strata.
func OnStrata(path string) (m Mount, ok bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Mount{}, false, fmt.Errorf("statfs %s: %w", path, err)
	}
	if st.Type != fuseSuperMagic {
		return Mount{}, false, nil
	}
	m, err = Containing(path)
	if err != nil {
		return Mount{}, false, err
	}
	return m, m.FSType == FSType, nil
}

// strataMounts returns the set of current Strata mount points (nil when
// the table cannot be read).
func strataMounts() (map[string]bool, error) {
	ms, err := Read()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, m := range ms {
		if m.FSType == FSType {
			out[m.Point] = true
		}
	}
	return out, nil
}
