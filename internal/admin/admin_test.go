package admin

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/mountinfo"
	"github.com/stratafs/strata/internal/rpc"
)

func noEnv(string) string { return "" }

// TestLocate: the cluster is found from flags, --data, and the running
// strata up's runtime record, without flags and from any directory; a
// --data that does not exist says so.
func TestLocate(t *testing.T) {
	t.Setenv("STRATA_RUNTIME_DIR", t.TempDir())
	elsewhere := t.TempDir()

	if _, err := Locate(Query{Dir: elsewhere, Getenv: noEnv}); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("nothing running: %v, want ErrNoCluster", err)
	}
	if _, err := Locate(Query{Data: "/nonexistent", Dir: elsewhere, Getenv: noEnv}); !errors.Is(err, ErrNoPath) || !strings.Contains(err.Error(), "/nonexistent") {
		t.Fatalf("--data /nonexistent: %v, want it to say the path does not exist", err)
	}
	c, err := Locate(Query{Meta: "10.0.0.1:7400", KeyFile: "/k", Dir: elsewhere, Getenv: noEnv})
	if err != nil || c.Meta != "10.0.0.1:7400" || c.KeyFile != "/k" {
		t.Fatalf("flags: %+v %v", c, err)
	}
	env := func(k string) string {
		return map[string]string{"STRATA_META": "10.0.0.2:7400", "STRATA_KEY_FILE": "/e"}[k]
	}
	if c, err := Locate(Query{Dir: elsewhere, Getenv: env}); err != nil || c.Meta != "10.0.0.2:7400" || c.KeyFile != "/e" {
		t.Fatalf("environment: %+v %v", c, err)
	}

	// A running strata up is found from anywhere.
	remove, err := mountinfo.WriteRecord(mountinfo.Record{Meta: "127.0.0.1:7777", KeyFile: "/data/cluster.key", Data: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	c, err = Locate(Query{Dir: elsewhere, Getenv: noEnv})
	if err != nil || c.Meta != "127.0.0.1:7777" || c.KeyFile != "/data/cluster.key" {
		t.Fatalf("running strata up: %+v %v", c, err)
	}
	// An address given alone takes the key file of the record with it.
	c, err = Locate(Query{Meta: "127.0.0.1:7777", Dir: elsewhere, Getenv: noEnv})
	if err != nil || c.KeyFile != "/data/cluster.key" {
		t.Fatalf("--meta of the running strata up: %+v %v", c, err)
	}
	// Two: the user must choose.
	remove2, err := mountinfo.WriteRecord(mountinfo.Record{Pid: os.Getppid(), Meta: "127.0.0.1:8888", Data: "/other"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Locate(Query{Dir: elsewhere, Getenv: noEnv}); !errors.Is(err, ErrNoCluster) || !strings.Contains(err.Error(), "/other") {
		t.Fatalf("two strata up: %v, want a choice naming both", err)
	}
	remove2()
	remove()
	if _, err := Locate(Query{Dir: elsewhere, Getenv: noEnv}); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("after the record is removed: %v", err)
	}

	// --data of a running strata up: its cluster.json.
	data := t.TempDir()
	b, _ := json.Marshal(UpInfo{Meta: "127.0.0.1:9999", KeyFile: filepath.Join(data, "cluster.key")})
	if err := os.WriteFile(filepath.Join(data, "cluster.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := Locate(Query{Data: data, Dir: elsewhere, Getenv: noEnv}); err != nil || c.Meta != "127.0.0.1:9999" {
		t.Fatalf("--data: %+v %v", c, err)
	}
}

// TestRecordOfDeadProcessIgnored: a record left by a killed daemon does
// not count.
func TestRecordOfDeadProcessIgnored(t *testing.T) {
	t.Setenv("STRATA_RUNTIME_DIR", t.TempDir())
	if _, err := mountinfo.WriteRecord(mountinfo.Record{Pid: math.MaxInt32 - 1, Meta: "127.0.0.1:1", Data: "/gone"}); err != nil {
		t.Fatal(err)
	}
	if rs := mountinfo.Records(); len(rs) != 0 {
		t.Fatalf("records of dead processes: %+v", rs)
	}
}

// TestSetValueKeepsFieldNotGiven: --count alone keeps the stripe size,
// --size alone the count.
func TestSetValueKeepsFieldNotGiven(t *testing.T) {
	cur := Layout{StripeSize: 4 << 20, StripeCount: 3}
	two, oneMiB := uint32(2), uint32(1<<20)
	for _, tc := range []struct {
		count, size *uint32
		want        string
	}{
		{&two, nil, "stripe_count=2,stripe_size=4194304"},
		{nil, &oneMiB, "stripe_count=3,stripe_size=1048576"},
		{&two, &oneMiB, "stripe_count=2,stripe_size=1048576"},
	} {
		if got := SetValue(cur, tc.count, tc.size); got != tc.want {
			t.Errorf("SetValue(%+v, %v, %v) = %q, want %q", cur, tc.count, tc.size, got, tc.want)
		}
	}
}

// TestStatusJSONConvention: every name is snake_case; times are RFC 3339;
// the meta member has the shape later issues build on.
func TestStatusJSONConvention(t *testing.T) {
	st := &rpc.ClusterStatusResp{
		MetaAddr: "127.0.0.1:7400", RaftState: "Leader", Term: 3, CommitIndex: 9, AppliedIndex: 9, DurableIndex: 8,
		Servers:  []rpc.ServerInfo{{ID: 1, Addr: "a", Alive: true, LastSeenMs: 1500}, {ID: 2, LastSeenMs: -1}},
		Targets:  []rpc.TargetInfo{{ID: 1, ServerID: 1, TotalBytes: 100, FreeBytes: 40, Alive: true}},
		Clients:  []rpc.ClientInfo{{ID: 7, OpenedMs: 1764000000000, LastSeenMs: 250}},
		Locks:    []rpc.LockInfo{{Ino: 5, Client: 7, Type: rpc.LockWrite, Flock: true, End: math.MaxUint64}},
		Problems: []string{"disk full"}, LocksTotal: 1, FreePendingFiles: 2, FreePendingBytes: 8192,
		Unsynced:    []rpc.TargetUnsynced{{Chunks: 3, Bytes: 11703, OldestMs: 2500}},
		Delegations: []rpc.DelegationInfo{{Client: 7, Dir: 12, Epoch: 40, GrantedMs: 1764000000000, Recalled: true}, {Client: 8, Dir: 13}},
	}
	doc := StatusOf(st, rpc.StatFSResp{TotalBytes: 100, FreeBytes: 50, AvailBytes: 40}, true)
	if ds := doc.Clients[0].Delegations; len(ds) != 1 || ds[0].Directory != 12 || ds[0].Epoch != 40 || !ds[0].Recalled {
		t.Errorf("client 7's delegations %+v, want directory 12 (epoch 40, recalled)", ds)
	} else if _, err := time.Parse(time.RFC3339, ds[0].GrantedAt); err != nil {
		t.Errorf("granted_at %q: %v", ds[0].GrantedAt, err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if !snake.MatchString(k) {
					t.Errorf("%s.%s: not snake_case", path, k)
				}
				if strings.HasSuffix(k, "_ms") {
					t.Errorf("%s.%s: milliseconds; the convention is _seconds or an RFC 3339 time", path, k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range v {
				walk(path+"[]", e)
			}
		}
	}
	walk("", v)
	if m := v.(map[string]any); m["free_pending_files"] != 2.0 || m["free_pending_bytes"] != 8192.0 {
		t.Errorf("free_pending_files, free_pending_bytes = %v, %v; want 2, 8192", m["free_pending_files"], m["free_pending_bytes"])
	}
	if tg := v.(map[string]any)["targets"].([]any)[0].(map[string]any); tg["unsynced_chunks"] != 3.0 || tg["unsynced_bytes"] != 11703.0 || tg["oldest_unsynced_seconds"] != 2.5 {
		t.Errorf("target unsynced_chunks, unsynced_bytes, oldest_unsynced_seconds = %v, %v, %v; want 3, 11703, 2.5",
			tg["unsynced_chunks"], tg["unsynced_bytes"], tg["oldest_unsynced_seconds"])
	}
	if _, err := time.Parse(time.RFC3339, doc.Clients[0].OpenedAt); err != nil {
		t.Errorf("opened_at %q: %v", doc.Clients[0].OpenedAt, err)
	}
	var shape struct {
		Meta struct {
			Leader string `json:"leader"`
			Term   uint64 `json:"term"`
			Voters []struct {
				Address      string `json:"address"`
				State        string `json:"state"`
				AppliedIndex uint64 `json:"applied_index"`
			} `json:"voters"`
			UnsyncedEntries uint64 `json:"unsynced_entries"`
		} `json:"meta"`
	}
	if err := json.Unmarshal(b, &shape); err != nil {
		t.Fatal(err)
	}
	m := shape.Meta
	if m.Leader != "127.0.0.1:7400" || m.Term != 3 || len(m.Voters) != 1 || m.Voters[0].State != "leader" || m.Voters[0].AppliedIndex != 9 {
		t.Errorf("meta member: %+v", m)
	}
	if m.UnsyncedEntries != 1 { // applied 9, durable 8
		t.Errorf("meta.unsynced_entries = %d, want 1", m.UnsyncedEntries)
	}
	if doc.Servers[1].HeartbeatAgeSeconds != nil || *doc.Servers[0].HeartbeatAgeSeconds != 1.5 {
		t.Errorf("heartbeat ages: unknown must be null, 1500 ms must be 1.5 s")
	}
	if doc.Locks.List[0].End != nil || doc.Locks.List[0].Kind != "flock" || doc.Health != "failing" {
		t.Errorf("lock or health: %+v %s", doc.Locks.List[0], doc.Health)
	}
}

// TestCapacityAsDf: used is size less free space (root's reserved blocks
// are not used), the percentage is used / (used + available), as df.
func TestCapacityAsDf(t *testing.T) {
	// A 100 GiB disk with 5 GiB reserved for root, 14 GiB used: free
	// 86 GiB, available to writes 81 GiB.
	const g = 1 << 30
	c := CapacityOf(rpc.StatFSResp{TotalBytes: 100 * g, FreeBytes: 86 * g, AvailBytes: 81 * g})
	if c.UsedBytes != 14*g || c.AvailBytes != 81*g || c.UsedPercent != 14.8 {
		t.Fatalf("capacity %+v, want used 14 GiB, avail 81 GiB, 14.8%% (df: 15%%)", c)
	}
}
