package fuse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/client"
	"github.com/stratafs/strata/internal/testutil"
)

// metaMetric reads one unlabelled metric of the metadata service.
func (tc *testCluster) metaMetric(name string) float64 {
	tc.t.Helper()
	resp, err := http.Get("http://" + tc.meta.MetricsAddr() + "/metrics")
	if err != nil {
		tc.t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tc.t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	tc.t.Fatalf("no metric %s", name)
	return 0
}

// readBack reads name and compares it with want.
func readBack(t *testing.T, name string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(name)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	if !bytes.Equal(got, want) {
		at := 0
		for at < len(got) && at < len(want) && got[at] == want[at] {
			at++
		}
		t.Fatalf("%s: %d bytes, want %d (first difference at %d)", name, len(got), len(want), at)
	}
}

// TestInlineData: files a mount with a create delegation writes and closes
// at up to InlineBytes keep their data with their inodes; another mount
// reads them back without a storage read, with their sizes and blocks; its
// appends, overwrites and truncates (which move the data to the chunks or
// cut it) read back on both mounts; a write through a dup'ed descriptor
// after the first close keeps every byte; SEEK_DATA/SEEK_HOLE, O_TRUNC
// rewrites, renames and unlinks of inline files behave as for any file.
func TestInlineData(t *testing.T) {
	requireFUSE(t)
	for _, policy := range []string{client.SyncPolicyAsync, client.SyncPolicySync} {
		t.Run(policy, func(t *testing.T) { testInlineData(t, policy) })
	}
}

func testInlineData(t *testing.T, policy string) {
	tc := startCluster(t, 1, 2)
	a, ca := tc.mount(func(c *client.Config) { c.CreateDelegation, c.InlineBytes, c.SyncPolicy = true, 4096, policy })
	b, cb := tc.mount(func(c *client.Config) { c.InlineBytes = 4096 })
	d := filepath.Join(a, "d")
	must(t, os.Mkdir(d, 0o755))
	var st syscall.Stat_t
	must(t, syscall.Stat(d, &st))
	const n = 40
	content := map[string][]byte{}
	write := func(name string, data []byte) {
		t.Helper()
		content[name] = data
		must(t, os.WriteFile(filepath.Join(d, name), data, 0o644))
	}
	for i := 0; i < n; i++ {
		write(fmt.Sprint("f", i), pattern(byte(i), 100+i*97))
	}
	waitHolding(t, ca, st.Ino)
	inlined := ca.Ops("create_inline")
	for i := 0; i < n; i++ {
		write(fmt.Sprint("g", i), pattern(byte(100+i), 100+i*97))
	}
	write("g3901", pattern(3, 3901))
	write("empty", []byte{})
	write("big", pattern(5, 5000))
	write("at4096", pattern(6, 4096))
	write("at4097", pattern(7, 4097))
	// Reopened for appending right after its close: the data folded into
	// the create goes back to write-behind (or is moved to the chunks);
	// every byte reads back.
	write("reopened", pattern(8, 700))
	rf, err := os.OpenFile(filepath.Join(d, "reopened"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = rf.Write([]byte("+more"))
	must(t, err)
	must(t, rf.Close())
	content["reopened"] = append(append([]byte{}, content["reopened"]...), "+more"...)
	readBack(t, filepath.Join(d, "reopened"), content["reopened"])
	// Truncated right after its close (its create maybe still queued),
	// shorter then longer.
	write("cutearly", pattern(9, 1000))
	must(t, os.Truncate(filepath.Join(d, "cutearly"), 100))
	must(t, os.Truncate(filepath.Join(d, "cutearly"), 500))
	content["cutearly"] = append(append([]byte{}, content["cutearly"][:100]...), make([]byte, 400)...)
	readBack(t, filepath.Join(d, "cutearly"), content["cutearly"])
	// Written only at an offset: the bytes before it are zeros.
	hf, err := os.Create(filepath.Join(d, "holey"))
	must(t, err)
	_, err = hf.WriteAt([]byte("tail"), 2000)
	must(t, err)
	must(t, hf.Close())
	content["holey"] = append(make([]byte, 2000), "tail"...)
	readBack(t, filepath.Join(d, "holey"), content["holey"])
	if ca.Ops("create_inline") == inlined {
		t.Fatal("A kept no file's data inline under the delegation")
	}
	t.Logf("%d files kept inline", ca.Ops("create_inline")-inlined)

	// A dup'ed descriptor writing after the first close: the data folded
	// into the create goes back to write-behind (or to the chunks).
	spills := tc.metaMetric("strata_meta_inline_spills_total")
	unfolded := ca.Ops("inline_unfolded")
	f, err := os.Create(filepath.Join(d, "dup"))
	must(t, err)
	_, err = f.Write([]byte("first half;"))
	must(t, err)
	fd2, err := syscall.Dup(int(f.Fd()))
	must(t, err)
	must(t, f.Close())
	if _, err := syscall.Pwrite(fd2, []byte("second half"), int64(len("first half;"))); err != nil {
		t.Fatal(err)
	}
	must(t, syscall.Close(fd2))
	content["dup"] = []byte("first half;second half")
	readBack(t, filepath.Join(d, "dup"), content["dup"])
	if ca.Ops("inline_unfolded") == unfolded && tc.metaMetric("strata_meta_inline_spills_total") == spills {
		t.Errorf("the write after the first close neither unfolded the inline data nor moved it out")
	}

	// B: every file byte-exact; the inline ones without a storage read.
	if _, err := os.Stat(filepath.Join(b, "d", "f0")); err != nil { // recalls the delegation
		t.Fatal(err)
	}
	inline := map[string]bool{}
	for name, data := range content {
		var fst syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(b, "d", name), &fst))
		if fst.Size != int64(len(data)) {
			t.Fatalf("%s on B: size %d, want %d", name, fst.Size, len(data))
		}
		attr, err := cb.GetAttr(t.Context(), fst.Ino)
		must(t, err)
		if attr.Inline {
			inline[name] = true
			if want := (int64(len(data)) + 511) / 512; fst.Blocks != want {
				t.Errorf("%s on B (inline): st_blocks %d, want %d", name, fst.Blocks, want)
			}
			if len(data) > 4096 {
				t.Errorf("%s of %d bytes is inline, over InlineBytes", name, len(data))
			}
		}
	}
	if len(inline) == 0 || inline["big"] || inline["at4097"] || !inline["at4096"] {
		t.Fatalf("inline files %v: want some, at4096, not big nor at4097", inline)
	}
	calls := tc.rpcsOf(func() {
		for name := range inline {
			readBack(t, filepath.Join(b, "d", name), content[name])
		}
	})
	if calls["store.read"] != 0 {
		t.Errorf("B's reads of %d inline files made %d storage reads: %v", len(inline), calls["store.read"], calls)
	}
	for name, data := range content {
		readBack(t, filepath.Join(b, "d", name), data)
	}
	// A mount that keeps no data inline itself (InlineBytes 0) reads
	// the inline files too.
	c0, _ := tc.mount(nil)
	for name := range inline {
		readBack(t, filepath.Join(c0, "d", name), content[name])
	}

	// Pick inline files for the changes below.
	var picks []string
	for i := 0; i < n && len(picks) < 8; i++ {
		if name := fmt.Sprint("g", i); inline[name] && len(content[name]) >= 400 {
			picks = append(picks, name)
		}
	}
	if len(picks) < 8 {
		t.Fatalf("only %d inline files of 400 bytes or more: %v", len(picks), picks)
	}
	appended, middle, cut, seek, trunc, renamed, removed, fromC0 := picks[0], picks[1], picks[2], picks[3], picks[4], picks[5], picks[6], picks[7]

	// The mount without inline data of its own writes one: moved out
	// first, as from any mount.
	wc, err := os.OpenFile(filepath.Join(c0, "d", fromC0), os.O_WRONLY, 0)
	must(t, err)
	_, err = wc.WriteAt([]byte("C0"), 0)
	must(t, err)
	must(t, wc.Close())
	content[fromC0] = append([]byte("C0"), content[fromC0][2:]...)
	readBack(t, filepath.Join(c0, "d", fromC0), content[fromC0])
	readBack(t, filepath.Join(b, "d", fromC0), content[fromC0])

	// B appends to one and overwrites the middle of another: the data
	// moves to the chunks first (a spill each).
	spills = tc.metaMetric("strata_meta_inline_spills_total")
	af, err := os.OpenFile(filepath.Join(b, "d", appended), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = af.Write([]byte("+appended by B"))
	must(t, err)
	must(t, af.Close())
	content[appended] = append(append([]byte{}, content[appended]...), "+appended by B"...)
	mf, err := os.OpenFile(filepath.Join(b, "d", middle), os.O_WRONLY, 0)
	must(t, err)
	mid := len(content[middle]) / 2
	_, err = mf.WriteAt([]byte("MIDDLE"), int64(mid))
	must(t, err)
	must(t, mf.Close())
	content[middle] = append([]byte{}, content[middle]...)
	copy(content[middle][mid:], "MIDDLE")
	if got := tc.metaMetric("strata_meta_inline_spills_total"); got < spills+2 {
		t.Errorf("spills %v after two writes to inline files, were %v", got, spills)
	}
	for _, name := range []string{appended, middle} {
		var fst syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(b, "d", name), &fst))
		if attr, err := cb.GetAttr(t.Context(), fst.Ino); err != nil || attr.Inline {
			t.Errorf("%s after a write: inline %v, %v", name, attr.Inline, err)
		}
		readBack(t, filepath.Join(b, "d", name), content[name])
		readBack(t, filepath.Join(a, "d", name), content[name])
	}

	// Truncate shorter, then longer: the cut bytes are zeros.
	must(t, os.Truncate(filepath.Join(b, "d", cut), 10))
	must(t, os.Truncate(filepath.Join(b, "d", cut), 300))
	content[cut] = append(append([]byte{}, content[cut][:10]...), make([]byte, 290)...)
	readBack(t, filepath.Join(b, "d", cut), content[cut])
	readBack(t, filepath.Join(a, "d", cut), content[cut])
	// Then a write past the kept bytes: the spill moves 10 bytes out of a
	// file of 300, the rest still zeros.
	wf, err := os.OpenFile(filepath.Join(b, "d", cut), os.O_WRONLY, 0)
	must(t, err)
	_, err = wf.WriteAt([]byte("W"), 100)
	must(t, err)
	must(t, wf.Close())
	content[cut][100] = 'W'
	readBack(t, filepath.Join(b, "d", cut), content[cut])
	readBack(t, filepath.Join(a, "d", cut), content[cut])

	// SEEK_DATA / SEEK_HOLE of an inline file: data at 0, the hole at
	// its end.
	for _, m := range []string{a, b} {
		sf, err := os.Open(filepath.Join(m, "d", seek))
		must(t, err)
		size := int64(len(content[seek]))
		if off, err := unix.Seek(int(sf.Fd()), 0, unix.SEEK_DATA); err != nil || off != 0 {
			t.Errorf("SEEK_DATA of inline %s: %d, %v; want 0", seek, off, err)
		}
		if off, err := unix.Seek(int(sf.Fd()), 0, unix.SEEK_HOLE); err != nil || off != size {
			t.Errorf("SEEK_HOLE of inline %s: %d, %v; want %d", seek, off, err, size)
		}
		if _, err := unix.Seek(int(sf.Fd()), size, unix.SEEK_DATA); !errors.Is(err, syscall.ENXIO) {
			t.Errorf("SEEK_DATA at the end of inline %s: %v, want ENXIO", seek, err)
		}
		must(t, sf.Close())
	}

	// An O_TRUNC rewrite with new content, from A then from B.
	content[trunc] = pattern(77, 1234)
	must(t, os.WriteFile(filepath.Join(a, "d", trunc), content[trunc], 0o644))
	readBack(t, filepath.Join(b, "d", trunc), content[trunc])
	readBack(t, filepath.Join(a, "d", trunc), content[trunc])
	content[trunc] = pattern(78, 99)
	must(t, os.WriteFile(filepath.Join(b, "d", trunc), content[trunc], 0o644))
	readBack(t, filepath.Join(a, "d", trunc), content[trunc])
	readBack(t, filepath.Join(b, "d", trunc), content[trunc])

	// A hard link on B reads the same bytes on both mounts.
	must(t, os.Link(filepath.Join(b, "d", seek), filepath.Join(b, "d", "hard")))
	content["hard"] = content[seek]
	var lst syscall.Stat_t
	must(t, syscall.Stat(filepath.Join(a, "d", "hard"), &lst))
	if lst.Nlink != 2 {
		t.Errorf("hard link of %s: nlink %d, want 2", seek, lst.Nlink)
	}

	// Rename and unlink on A.
	must(t, os.Rename(filepath.Join(a, "d", renamed), filepath.Join(a, "d", "renamed")))
	content["renamed"] = content[renamed]
	delete(content, renamed)
	must(t, os.Remove(filepath.Join(a, "d", removed)))
	delete(content, removed)
	for _, gone := range []string{renamed, removed} {
		// B looked the names up before: its kernel keeps them for the
		// entry timeout (1 s).
		if err := testutil.WaitFor(5*time.Second, func() error {
			if _, err := os.Stat(filepath.Join(b, "d", gone)); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%s on B after A's rename/unlink: %v", gone, err)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	for name, data := range content {
		readBack(t, filepath.Join(b, "d", name), data)
		readBack(t, filepath.Join(a, "d", name), data)
	}
}
