package peers

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestDpkgInstalled(t *testing.T) {
	for status, want := range map[string]bool{
		"install ok installed":       true,
		"install ok installed\n":     true,
		"deinstall ok config-files":  false,
		"install ok half-configured": false,
		"unknown ok not-installed":   false,
		"":                           false,
	} {
		if got := dpkgInstalled([]byte(status)); got != want {
			t.Errorf("dpkgInstalled(%q) = %v, want %v", status, got, want)
		}
	}
}

// fakeInstaller records the commands an installer would run.
func fakeInstaller(have map[string]bool, fail map[string]error) (*installer, *[][]string) {
	var ran [][]string
	in := &installer{
		installed: func(p string) bool { return have[p] },
		run: func(_ context.Context, argv []string) error {
			ran = append(ran, argv)
			if err := fail[argv[1]]; err != nil {
				return err
			}
			if argv[1] == "install" {
				for _, a := range argv[2:] {
					if !strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "Dpkg::") {
						have[a] = true
					}
				}
			}
			return nil
		},
		logf: func(string, ...any) {},
	}
	return in, &ran
}

func TestInstallerUpdatesOnceAndInstallsExactNames(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the installer refuses to run apt-get when not root")
	}
	have := map[string]bool{"glusterfs-client": true}
	in, ran := fakeInstaller(have, nil)
	ctx := context.Background()
	if err := in.ensure(ctx, glusterPackages...); err != nil {
		t.Fatal(err)
	}
	if err := in.ensure(ctx, moosePackages...); err != nil {
		t.Fatal(err)
	}
	if err := in.ensure(ctx, moosePackages...); err != nil { // all present now: nothing runs
		t.Fatal(err)
	}
	want := [][]string{
		{"apt-get", "update"},
		installArgv([]string{"glusterfs-server"}),
		installArgv(moosePackages),
	}
	if !reflect.DeepEqual(*ran, want) {
		t.Fatalf("ran %q\nwant %q", *ran, want)
	}
	argv := installArgv([]string{"moosefs-master"})
	if argv[0] != "apt-get" || argv[1] != "install" || argv[2] != "-y" || argv[len(argv)-1] != "moosefs-master" {
		t.Errorf("install command %q", argv)
	}
}

func TestInstallerReportsFailures(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the installer refuses to run apt-get when not root")
	}
	// A failed update is not fatal; a failed install is, naming the packages.
	in, ran := fakeInstaller(map[string]bool{}, map[string]error{"update": errors.New("offline"), "install": errors.New("E: Unable to locate package")})
	err := in.ensure(context.Background(), "fio")
	if err == nil || !strings.Contains(err.Error(), "fio") {
		t.Fatalf("err = %v", err)
	}
	if len(*ran) != 2 {
		t.Errorf("ran %q, want update then install", *ran)
	}
	// apt-get that "succeeds" without installing is caught by the dpkg check.
	in, _ = fakeInstaller(map[string]bool{}, nil)
	in.run = func(context.Context, []string) error { return nil }
	if err := in.ensure(context.Background(), "fuse3"); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Errorf("err = %v", err)
	}
}

func TestLeftoverPIDs(t *testing.T) {
	proc := t.TempDir()
	dir := "/var/tmp/strata-bench-peers"
	for pid, argv := range map[string][]string{
		"100":  {"/usr/local/bin/strata", "up", "--data", dir + "/strata-data", "--mount", dir + "/strata-mnt"},
		"101":  {"/tmp/strata", "passthrough", dir + "/passthrough-src", dir + "/passthrough-mnt"},
		"102":  {"/tmp/strata", "up", "--data", "/home/u/strata-data", "--mount", "/mnt"}, // someone else's cluster
		"103":  {"vim", dir + "/strata-data/notes"},                                       // a path below ours is not ours
		"104":  {"bash"},
		"105":  {"/tmp/strata", "up", "--data", dir + "/strata-data"}, // self, excluded
		"self": {"x"},
	} {
		os.MkdirAll(filepath.Join(proc, pid), 0o755)
		os.WriteFile(filepath.Join(proc, pid, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644)
	}
	os.MkdirAll(filepath.Join(proc, "106"), 0o755) // exited: no cmdline
	got := leftoverPIDs(proc, dir, 105)
	if !reflect.DeepEqual(got, []int{100, 101}) {
		t.Errorf("leftovers %v, want [100 101]", got)
	}
}

func TestCommandLines(t *testing.T) {
	if got := upArgv("/bin/strata", "/w/strata-data", "/w/strata-mnt"); !reflect.DeepEqual(got, []string{"/bin/strata", "up", "--data", "/w/strata-data", "--mount", "/w/strata-mnt"}) {
		t.Errorf("up: %q", got)
	}
	if got := upArgv("/bin/strata", "/d", "/m", "--sync-policy", "async"); !reflect.DeepEqual(got, []string{"/bin/strata", "up", "--data", "/d", "--mount", "/m", "--sync-policy", "async"}) {
		t.Errorf("up with flags: %q", got)
	}
	// The up command line is recognised as a leftover by its paths.
	if !argvHasAny(bytesArgs(upArgv("/bin/strata", "/w/strata-data", "/w/strata-mnt")), hostDaemonPaths("/w")) {
		t.Error("up's command line does not carry the leftover marks")
	}
	um := unmountArgvs("/w/m")
	if len(um) < 3 || !reflect.DeepEqual(um[0], []string{"fusermount3", "-u", "/w/m"}) {
		t.Errorf("unmount ladder %q", um)
	}
	lazy := false
	for _, a := range um {
		lazy = lazy || reflect.DeepEqual(a, []string{"fusermount3", "-u", "-z", "/w/m"})
	}
	if !lazy {
		t.Errorf("unmount ladder lacks fusermount3 -u -z: %q", um)
	}
	for _, ns := range []string{nsHub, inNS("strata-bench-x", "ls")[1]} {
		if !strings.Contains(ns, nsPrefix) {
			t.Errorf("%q lacks the namespace prefix", ns)
		}
	}
}

func bytesArgs(ss []string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

func TestParseCPUAndBusyShare(t *testing.T) {
	a, err := parseCPU("intr 1 2\ncpu  100 0 100 700 100 0 0 0 0 0\ncpu0 50 0 50 350 50 0 0 0 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if a.busy != 200 || a.total != 1000 {
		t.Fatalf("parsed %+v, want busy 200 of 1000 (idle and iowait not busy)", a)
	}
	b := cpuTimes{busy: a.busy + 30, total: a.total + 100}
	if got := busyShare(a, b); got < 0.299 || got > 0.301 {
		t.Fatalf("busy share %v, want 0.3", got)
	}
	if got := busyShare(b, b); got != 0 {
		t.Fatalf("busy share of no time %v, want 0", got)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5\n", "cpu 1 2 x 4 5\n"} {
		if _, err := parseCPU(bad); err == nil {
			t.Fatalf("parseCPU(%q) accepted", bad)
		}
	}
}

func TestDiskTicks(t *testing.T) {
	stats := " 254 0 vda 1 2 3 4 5 6 7 8 0 1000 9\n 254 1 vda1 1 2 3 4 5 6 7 8 0 999 9\n 7 0 loop0 1 2 3 4 5 6 7 8 0 5000 9\n"
	a := parseDiskTicks(stats, map[string]bool{"vda": true})
	if len(a) != 1 || a["vda"] != 1000 {
		t.Fatalf("parsed %v, want only vda at 1000 ms", a)
	}
	b := map[string]uint64{"vda": 1050}
	if got := diskBusy(a, b, 250*time.Millisecond); got < 0.199 || got > 0.201 {
		t.Fatalf("disk busy %v, want 0.2 (50 ms of 250)", got)
	}
	if got := diskBusy(a, a, 250*time.Millisecond); got != 0 {
		t.Fatalf("idle disk busy %v", got)
	}
}

func TestTurnOrderBalancesNeighbours(t *testing.T) {
	if got := turnOrder(5, 1); !slices.Equal(got, []int{0, 1, 4, 2, 3}) {
		t.Fatalf("turn 1 of 5: %v, want 0 1 4 2 3", got)
	}
	if got := turnOrder(5, 2); !slices.Equal(got, []int{1, 2, 0, 3, 4}) {
		t.Fatalf("turn 2 of 5: %v, want 1 2 0 3 4", got)
	}
	for n := 1; n <= 7; n++ {
		period := n
		if n%2 == 1 {
			period = 2 * n
		}
		pos := map[[2]int]int{}   // (system, position) → turns
		after := map[[2]int]int{} // (previous, system) → turns
		for turn := 1; turn <= period; turn++ {
			o := turnOrder(n, turn)
			if len(o) != n {
				t.Fatalf("n=%d turn %d: %v is not a permutation", n, turn, o)
			}
			seen := map[int]bool{}
			for k, s := range o {
				if s < 0 || s >= n || seen[s] {
					t.Fatalf("n=%d turn %d: %v is not a permutation", n, turn, o)
				}
				seen[s] = true
				pos[[2]int{s, k}]++
				if k > 0 {
					after[[2]int{o[k-1], s}]++
				}
			}
		}
		want := period / n
		if len(pos) != n*n {
			t.Errorf("n=%d: %d (system, position) pairs over %d turns, want all %d", n, len(pos), period, n*n)
		}
		for k, c := range pos {
			if c != want {
				t.Errorf("n=%d: system %d in position %d in %d turns, want %d", n, k[0], k[1], c, want)
			}
		}
		if len(after) != n*(n-1) {
			t.Errorf("n=%d: %d ordered neighbour pairs over %d turns, want all %d", n, len(after), period, n*(n-1))
		}
		for k, c := range after {
			if c != want {
				t.Errorf("n=%d: system %d right after %d in %d turns, want %d", n, k[1], k[0], c, want)
			}
		}
	}
}

func TestUpFlagsMayNotMoveTheCluster(t *testing.T) {
	for _, f := range [][]string{{"--data", "/x"}, {"--mount=/y"}} {
		_, err := Run(context.Background(), Config{Dir: t.TempDir(), UpFlags: f})
		if err == nil || !strings.Contains(err.Error(), "is the run's own") {
			t.Errorf("up flags %q: %v", f, err)
		}
	}
}

// The local directory gets a second smallfile series with an fsync per
// file, the durable baseline, unless the suite already fsyncs every file.
func TestFsyncBaseline(t *testing.T) {
	bc := DefaultBench()
	if !slices.Contains(bc.Workloads, "smallfile") {
		t.Fatalf("the peers suite lacks smallfile: %v", bc.Workloads)
	}
	fc, ok := fsyncBaseline("local", bc)
	if !ok || fc.System != LocalFsync || !fc.SmallFileFsync || !slices.Equal(fc.Workloads, []string{"smallfile"}) {
		t.Fatalf("local: %v %+v", ok, fc)
	}
	if bc.SmallFileFsync || len(bc.Workloads) != len(fc.Workloads)+4 {
		t.Fatalf("the suite itself changed: %+v", bc)
	}
	for _, name := range []string{"passthrough", "strata"} {
		if _, ok := fsyncBaseline(name, bc); ok {
			t.Errorf("%s got an fsync series", name)
		}
	}
	bc.Workloads = []string{"seq", "meta"}
	if _, ok := fsyncBaseline("local", bc); ok {
		t.Error("fsync series without smallfile in the suite")
	}
	bc.Workloads, bc.SmallFileFsync = []string{"smallfile"}, true
	if _, ok := fsyncBaseline("local", bc); ok {
		t.Error("fsync series although every file is fsynced already")
	}
}

// Ganesha's configuration exports the directory on the ports the driver
// dials, NFSv3 over TCP only, to 127.0.0.1 read-write without root squash
// (the options of strata-nfs's export).
func TestGaneshaConfig(t *testing.T) {
	s := &ganeshaNFS{dir: "/var/tmp/x/ganesha/export"}
	conf := ganeshaConfig(s.dir, ganeshaPort)
	tg := s.target()
	for _, want := range []string{
		"NFS_Port = " + strconv.Itoa(ganeshaPort) + ";", "MNT_Port = " + strconv.Itoa(ganeshaPort+1) + ";",
		"Path = /var/tmp/x/ganesha/export;", "Protocols = 3;", "Transports = TCP;",
		"Clients = 127.0.0.1;", "Access_Type = RW;", "Squash = No_Root_Squash;", "Name = VFS;",
		"Bind_addr = 127.0.0.1;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("ganesha.conf lacks %q:\n%s", want, conf)
		}
	}
	if tg.nfsAddr != "127.0.0.1:"+strconv.Itoa(ganeshaPort) || tg.mountAddr != "127.0.0.1:"+strconv.Itoa(ganeshaPort+1) || tg.export != s.dir {
		t.Errorf("target %+v does not match the configuration", tg)
	}
	if strings.Count(conf, "{") != strings.Count(conf, "}") {
		t.Errorf("unbalanced braces:\n%s", conf)
	}
}
