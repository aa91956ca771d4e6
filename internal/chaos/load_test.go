package chaos

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLoadVerifyFindsLossDoublesAndCorruption runs the load on a local
// directory, then damages what it left in each way the check must catch.
func TestLoadVerifyFindsLossDoublesAndCorruption(t *testing.T) {
	dir := t.TempDir()
	l, err := StartLoad(LoadConfig{Dir: dir, Workers: 2, Keep: 5, RecordBytes: 64 << 10, MaxWriterBytes: 1 << 20,
		Writers: 2, Readers: 2, ReadFiles: 2, ReadFileBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var creates, writes int
		for _, op := range l.Ops() {
			switch op.Kind {
			case "create":
				creates++
			case "write+fsync":
				writes++
			}
		}
		if creates > 20 && writes > 70*len(l.writers) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.Stop()
	c, err := l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if !c.OK() || c.Files == 0 || c.Records == 0 || c.Reads == 0 {
		t.Fatalf("undamaged load: %+v", c)
	}
	w := l.workers[0]
	lost := filepath.Join(w.dir, w.live[0])
	if err := os.Remove(lost); err != nil {
		t.Fatal(err)
	}
	extra := filepath.Join(w.dir, "f9999999")
	if err := os.WriteFile(extra, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var name string
	w0 := l.writers[0]
	for n, recs := range w0.records {
		if recs > 0 {
			name = n
		}
	}
	if w0.checked == 0 {
		t.Fatalf("the writer verified and removed no file (records %v)", w0.records)
	}
	rec := filepath.Join(w0.dir, name)
	f, err := os.OpenFile(rec, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c, err = l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if c.OK() || len(c.Lost) != 1 || c.Lost[0] != lost || len(c.Extra) != 1 || c.Extra[0] != extra || len(c.Bad) != 1 {
		t.Fatalf("damaged load: lost %v extra %v bad %v", c.Lost, c.Extra, c.Bad)
	}
}

// TestLoadReadersFindCorruptAndStaleReads: the readers' checks find a
// pre-written file whose bytes changed and an acknowledged record that
// reads otherwise, and Pause holds every operation until Resume.
func TestLoadReadersFindCorruptAndStaleReads(t *testing.T) {
	dir := t.TempDir()
	l, err := StartLoad(LoadConfig{Dir: dir, RecordBytes: 64 << 10, MaxWriterBytes: 64 << 20, Writers: 1,
		Readers: 2, ReadFiles: 1, ReadFileBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	count := func(kind string) int {
		c := 0
		for _, op := range l.Ops() {
			if op.Kind == kind && op.Err == nil {
				c++
			}
		}
		return c
	}
	waitOps := func(kind string, n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			c := count(kind)
			if c >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d %s operations within 10s, want %d", c, kind, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitOps("read", 50)
	waitOps("write+fsync", 5)
	l.Pause()
	before := len(l.Ops())
	time.Sleep(200 * time.Millisecond)
	if after := len(l.Ops()); after != before {
		t.Fatalf("%d operations while paused", after-before)
	}
	// Damage the pre-written file and every acknowledged record.
	junk := make([]byte, 64<<10)
	for i := range junk {
		junk[i] = 0xa5
	}
	if err := os.WriteFile(l.readPath(0), junk, 0o644); err != nil {
		t.Fatal(err)
	}
	l.ackMu.Lock()
	acked := maps.Clone(l.acked)
	l.ackMu.Unlock()
	for name, a := range acked {
		f, err := os.OpenFile(filepath.Join(dir, "writer", name), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for r := range a.n {
			if _, err := f.WriteAt(junk, int64(r)*int64(len(junk))); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
	}
	// 200 reads after the damage (a loaded machine ran many more than
	// 200 before it: counting all of them, the check stopped the load
	// before a damaged record was read).
	damaged := count("read")
	l.Resume()
	waitOps("read", damaged+200)
	l.Stop()
	c, err := l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	var stale, corrupt bool
	for _, s := range c.Corrupt {
		stale = stale || strings.Contains(s, "stale")
		corrupt = corrupt || strings.Contains(s, "data-00")
	}
	if c.OK() || c.CorruptReads == 0 || !stale || !corrupt {
		t.Fatalf("damaged files: %d reads, %d corrupt: %v", c.Reads, c.CorruptReads, c.Corrupt)
	}
}

func TestStampRoundTrip(t *testing.T) {
	for _, c := range []struct {
		held bool
		name string
		seq  int
	}{{true, "locker-0", 7}, {false, "holder-12", 1}} {
		held, name, seq, err := parseStamp(stamp(c.held, c.name, c.seq))
		if err != nil || held != c.held || name != c.name || seq != c.seq {
			t.Fatalf("stamp %+v read back as %v %q %d %v", c, held, name, seq, err)
		}
	}
	if held, _, _, err := parseStamp(make([]byte, stampLen)); held || err != nil {
		t.Fatalf("a hole: held %v, %v; want free", held, err)
	}
	torn := stamp(true, "locker-0", 3)
	copy(torn, "xx")
	if _, _, _, err := parseStamp(torn); err == nil {
		t.Fatal("a torn stamp was accepted")
	}
}

// ofdLock takes (or, with F_UNLCK, releases) an OFD lock of the stamp's
// range: it conflicts with the lockers' POSIX locks although they are
// this process's.
func ofdLock(t *testing.T, f *os.File, typ int16) {
	t.Helper()
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: lockOff, Len: stampLen}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &lk); err != nil {
		t.Fatal(err)
	}
}

// TestLockersCheckExclusion runs a locker on a local file, takes its lock
// away as another holder would and leaves the range HELD: by a holder
// known dead (no violation), then by one not known dead (a violation).
func TestLockersCheckExclusion(t *testing.T) {
	dir := t.TempDir()
	l, err := StartLoad(LoadConfig{Dir: dir, Lockers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	waitGrants := func(what string) time.Duration {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if wait, ok := l.GrantWait(); ok {
				return wait
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the locker was not granted its lock within 10s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	l.WatchGrants(l.Now())
	waitGrants("at start")
	f, err := os.OpenFile(l.LockFiles()[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hold := func(name string, d time.Duration) {
		ofdLock(t, f, unix.F_WRLCK)
		if _, err := f.WriteAt(stamp(true, name, 1), lockOff); err != nil {
			t.Fatal(err)
		}
		time.Sleep(d)
		l.WatchGrants(l.Now())
		ofdLock(t, f, unix.F_UNLCK) // gone without writing FREE
	}
	l.HolderDied("holder-1")
	hold("holder-1", time.Second)
	if wait := waitGrants("after the dead holder"); wait > 5*time.Second {
		t.Fatalf("granted %v after the release", wait)
	}
	hold("intruder", 0)
	waitGrants("after the live holder")
	l.Stop()
	c, err := l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.LockViolations) != 1 || !strings.Contains(c.LockViolations[0], "intruder") || c.LockGrants < 3 {
		t.Fatalf("lock grants %d, violations %q: want one, of the intruder", c.LockGrants, c.LockViolations)
	}
	var waits int
	for _, op := range l.Ops() {
		if op.Kind == "lock" && op.End-op.Start >= 500*time.Millisecond {
			waits++
		}
	}
	if waits == 0 {
		t.Fatal("no lock operation recorded the wait for the dead holder")
	}
}

// TestMeasureLockWaits: the lockers' waits are a trial's lock stall, not
// its stall, except in a kill-lock-client trial; a wait that goes on into
// a later kill-lock-client's hold counts until its holder started.
func TestMeasureLockWaits(t *testing.T) {
	s := time.Second
	ops := []Op{
		{Kind: "write+fsync", Start: 10 * s, End: 12 * s},
		{Kind: "lock", Start: 11 * s, End: 40 * s}, // the grace, then the holder of trial 2
		{Kind: "lock", Start: 41 * s, End: 47 * s},
	}
	trials := []Trial{{N: 1, Fault: KillAll, At: 9 * s}, {N: 2, Fault: KillLockClient, At: 30 * s, holderAt: 25 * s}}
	trials[0].measure(ops, trials[1].At, trials[1:])
	trials[1].measure(ops, 50*s, nil)
	if got := trials[0]; got.StallSeconds != 2 || got.StallOp != "write+fsync at 10.0s" || got.LockStallSeconds != 14 || got.OtherStallSeconds != 2 {
		t.Errorf("kill-all: stall %v (%s), lock stall %v, other %v; want 2 (the write), 14 (until the holder), 2",
			got.StallSeconds, got.StallOp, got.LockStallSeconds, got.OtherStallSeconds)
	}
	if got := trials[1]; got.StallSeconds != 29 || got.LockStallSeconds != 29 || got.OtherStallSeconds != 0 || got.Ops != 2 {
		t.Errorf("kill-lock-client: stall %v, lock stall %v, other %v over %d ops; want 29, 29, 0 over 2", got.StallSeconds, got.LockStallSeconds, got.OtherStallSeconds, got.Ops)
	}
}
