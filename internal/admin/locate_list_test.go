package admin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stratafs/strata/internal/mountinfo"
)

// TestLocateVoterList: Locate returns the metadata voters as a list, from
// flags, a runtime record and cluster.json alike; a record of an older
// version (one address) still works; a key file comes from a record that
// names any voter given; a bad list is ErrBadMeta naming --meta.
func TestLocateVoterList(t *testing.T) {
	t.Setenv("STRATA_RUNTIME_DIR", t.TempDir())
	elsewhere := t.TempDir()
	voters := []string{"10.0.0.1:7400", "10.0.0.2:7400", "10.0.0.3:7400"}
	list := strings.Join(voters, ",")

	c, err := Locate(Query{Meta: list, KeyFile: "/k", Dir: elsewhere, Getenv: noEnv})
	if err != nil || !slices.Equal(c.MetaAddrs, voters) {
		t.Fatalf("--meta %s: %+v %v", list, c, err)
	}
	for _, bad := range []string{"10.0.0.1:7400,,10.0.0.2:7400", "10.0.0.1:7400,10.0.0.1:7400", "10.0.0.1:70000"} {
		if _, err := Locate(Query{Meta: bad, Dir: elsewhere, Getenv: noEnv}); !errors.Is(err, ErrBadMeta) || !strings.Contains(err.Error(), "--meta") {
			t.Fatalf("--meta %s: %v, want ErrBadMeta naming --meta", bad, err)
		}
	}

	// A record of a mount started with the list: found without flags, and
	// its key file goes with any one voter given.
	remove, err := mountinfo.WriteRecord(mountinfo.Record{Meta: list, KeyFile: "/voters.key", Data: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	c, err = Locate(Query{Dir: elsewhere, Getenv: noEnv})
	if err != nil || !slices.Equal(c.MetaAddrs, voters) || c.KeyFile != "/voters.key" {
		t.Fatalf("record with a list: %+v %v", c, err)
	}
	c, err = Locate(Query{Meta: voters[2], Dir: elsewhere, Getenv: noEnv})
	if err != nil || c.KeyFile != "/voters.key" || !slices.Equal(c.MetaAddrs, voters[2:]) {
		t.Fatalf("--meta of one voter of a record: %+v %v", c, err)
	}
	remove()

	// A record as an older version wrote it: one address.
	dir := mountinfo.RuntimeDir()
	old := `{"pid": ` + strconv.Itoa(os.Getpid()) + `, "mount": "", "meta": "127.0.0.1:7777", "key_file": "/old.key", "data": "/old"}`
	if err := os.WriteFile(filepath.Join(dir, "mount-"+strconv.Itoa(os.Getpid())+".json"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err = Locate(Query{Dir: elsewhere, Getenv: noEnv})
	if err != nil || !slices.Equal(c.MetaAddrs, []string{"127.0.0.1:7777"}) || c.KeyFile != "/old.key" {
		t.Fatalf("record of an older version: %+v %v", c, err)
	}

	// cluster.json of a strata up with several voters.
	data := t.TempDir()
	b, _ := json.Marshal(UpInfo{Meta: list, KeyFile: "/up.key"})
	if err := os.WriteFile(filepath.Join(data, "cluster.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := Locate(Query{Data: data, Dir: elsewhere, Getenv: noEnv}); err != nil || !slices.Equal(c.MetaAddrs, voters) {
		t.Fatalf("--data: %+v %v", c, err)
	}
}
