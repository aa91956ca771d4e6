package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stratafs/strata/internal/mountinfo"
	"github.com/stratafs/strata/internal/transport"
)

// ErrNoCluster: no way to find a cluster was given or found.
var ErrNoCluster = errors.New("no metadata service address")

// ErrBadMeta: the metadata address list found is not a valid one.
var ErrBadMeta = errors.New("bad metadata address list")

// ErrNoPath: a path given on the command line does not exist.
var ErrNoPath = errors.New("does not exist")

// DefaultDataDir is strata up's --data default.
const DefaultDataDir = "./strata-data"

// UpInfo is what strata up records in DATA/cluster.json while it runs.
type UpInfo struct {
	Meta    string `json:"meta"` // the metadata voters' addresses, comma-separated (one: no comma)
	KeyFile string `json:"key_file"`
	Mount   string `json:"mount"`
	Pid     int    `json:"pid"`
	NFS     string `json:"nfs,omitempty"` // strata up --nfs: the gateway's address (NFS and MOUNT on one port)
}

// Query is what the user gave to find a cluster.
type Query struct {
	Meta, KeyFile string // flags (override the environment)
	Data          string // --data, or "" when not given
	Dir           string // where to look for a mount (the working directory)
	Getenv        func(string) string
}

// Cluster is where a cluster was found.
type Cluster struct {
	Meta      string   // the metadata voters' addresses as found: "A" or "A,B,C"
	MetaAddrs []string // Meta parsed and checked
	KeyFile   string   // "" = empty key
	From      string   // how it was found, for messages
}

// Locate finds the metadata service's addresses (its voters, a list as
// `--meta A,B,C` gives it) and the key file, in order: flags and
// $STRATA_META / $STRATA_KEY_FILE; --data's cluster.json; the Strata mount
// that q.Dir lies on (its runtime record, else its source);
// ./strata-data/cluster.json; the one running strata up of this machine.
// A key file not found with the addresses comes from a runtime record
// naming one of them. A list that does not parse is ErrBadMeta.
func Locate(q Query) (Cluster, error) {
	c, err := locate(q)
	if err != nil {
		return Cluster{}, err
	}
	if c.MetaAddrs, err = transport.ParseAddrList(c.Meta); err != nil {
		from := c.From
		if from == "flags" {
			from = "--meta"
		}
		return Cluster{}, fmt.Errorf("%w (%s): %v", ErrBadMeta, from, err)
	}
	return withKey(c), nil
}

func locate(q Query) (Cluster, error) {
	getenv := q.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	c := Cluster{Meta: q.Meta, KeyFile: q.KeyFile, From: "flags"}
	if c.Meta == "" {
		c.Meta = getenv("STRATA_META")
		c.From = "$STRATA_META"
	}
	if c.KeyFile == "" {
		c.KeyFile = getenv("STRATA_KEY_FILE")
	}
	if c.Meta != "" {
		return c, nil
	}
	if q.Data != "" {
		info, err := readUpInfo(q.Data)
		if err != nil {
			return Cluster{}, err
		}
		return fill(c, info.Meta, info.KeyFile, "cluster.json in "+q.Data), nil
	}
	if q.Dir != "" {
		if m, ok, _ := mountinfo.OnStrata(q.Dir); ok {
			if r, ok := mountinfo.RecordFor(m.Point); ok {
				return fill(c, r.Meta, r.KeyFile, "the mount at "+m.Point), nil
			}
			if a, ok := m.MetaAddr(); ok {
				return fill(c, a, "", "the mount at "+m.Point), nil
			}
		}
		dd := filepath.Join(q.Dir, DefaultDataDir)
		if _, err := os.Stat(dd); err == nil {
			if info, err := readUpInfo(dd); err == nil {
				return fill(c, info.Meta, info.KeyFile, "cluster.json in "+dd), nil
			}
		}
	}
	var ups []mountinfo.Record
	for _, r := range mountinfo.Records() {
		if r.Data != "" {
			ups = append(ups, r)
		}
	}
	switch len(ups) {
	case 1:
		return fill(c, ups[0].Meta, ups[0].KeyFile, fmt.Sprintf("the strata up of pid %d", ups[0].Pid)), nil
	case 0:
		return Cluster{}, fmt.Errorf("%w: no strata up is running here and %s is not on a Strata mount; pass --meta ADDR (and --key-file), set STRATA_META, or --data DIR of a strata up", ErrNoCluster, q.Dir)
	}
	var which []string
	for _, r := range ups {
		which = append(which, fmt.Sprintf("pid %d with --data %s", r.Pid, r.Data))
	}
	return Cluster{}, fmt.Errorf("%w: %d strata up are running (%s): pick one with --data DIR, or run inside its mount", ErrNoCluster, len(ups), strings.Join(which, ", "))
}

// fill sets the address (and the key file when not yet known).
func fill(c Cluster, meta, keyFile, from string) Cluster {
	c.Meta, c.From = meta, from
	if c.KeyFile == "" {
		c.KeyFile = keyFile
	}
	return c
}

// withKey looks up a key file for c's addresses in the runtime records
// when none was given: a record naming one of them.
func withKey(c Cluster) Cluster {
	if c.KeyFile != "" {
		return c
	}
	for _, r := range mountinfo.Records() {
		if r.KeyFile != "" && slices.ContainsFunc(r.MetaAddrs(), func(a string) bool { return slices.Contains(c.MetaAddrs, a) }) {
			c.KeyFile = r.KeyFile
			return c
		}
	}
	return c
}

// readUpInfo reads the cluster.json of a strata up data directory.
func readUpInfo(data string) (UpInfo, error) {
	if _, err := os.Stat(data); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return UpInfo{}, fmt.Errorf("--data %s: %w", data, ErrNoPath)
		}
		return UpInfo{}, fmt.Errorf("--data %s: %w", data, err)
	}
	b, err := os.ReadFile(filepath.Join(data, "cluster.json"))
	if err != nil {
		if _, kerr := os.Stat(filepath.Join(data, "cluster.key")); kerr == nil {
			return UpInfo{}, fmt.Errorf("no strata up is running on %s (start it: strata up --data %s), or pass --meta ADDR for another cluster", data, data)
		}
		return UpInfo{}, fmt.Errorf("%s is not the data directory of a strata up (no cluster.json): %w", data, ErrNoCluster)
	}
	var info UpInfo
	if err := json.Unmarshal(b, &info); err != nil || info.Meta == "" {
		return UpInfo{}, fmt.Errorf("%s: unreadable cluster.json", data)
	}
	return info, nil
}
