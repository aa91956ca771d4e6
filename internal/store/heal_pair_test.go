package store

import (
	"bytes"
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

// newHealPair is a mirror pair (mirror_helpers_test.go: two stores
// registered with the stand-in metadata service, group 1 over their
// targets, the group map pushed as heartbeat answers) seen as a healPair.
func newHealPair(t *testing.T) *healPair {
	p := newMirrorPair(t, nil)
	m := &healPair{t: t, pri: p.a, sec: p.b, tp: p.ta, ts: p.tb, group: 1, chunks: map[uint64][]byte{}}
	m.epoch = p.epoch
	m.setSync = func(inSync bool) {
		g := p.meta.group(1)
		g.State = rpc.GroupInSync
		if !inSync {
			g.State = rpc.GroupDegraded
		}
		g.Epoch += 2
		p.meta.setGroup(g)
		p.push()
	}
	m.write = func(ino, off uint64, data []byte) error { return p.gwrite(p.a, ino, off, data, false) }
	m.copyBadReports = func() int { return len(p.meta.reported(rpc.MirrorCopyBad)) }
	m.splitEpochs = func() {
		g := p.meta.group(1)
		g.Epoch++
		p.b.s.installGroups([]rpc.GroupInfo{g}, 0, false)
	}
	return m
}

// TestGroupWriteOverBadBlocks: a client's partial write of a group chunk
// over blocks bad on one copy (the primary's and the secondary's, in
// turn) succeeds: the bad edge blocks are repaired from the other copy
// before the write is applied there, and the group stays in sync.
func TestGroupWriteOverBadBlocks(t *testing.T) {
	for _, bad := range []string{"primary", "secondary"} {
		t.Run(bad, func(t *testing.T) {
			p := newMirrorPair(t, nil)
			const ino = 0x6006
			want := pattern(8, 64<<10)
			if err := p.gwrite(p.a, ino, 0, want, true); err != nil {
				t.Fatal(err)
			}
			e := p.a
			if bad == "secondary" {
				e = p.b
			}
			flipBit(t, dataPath(e.dirs[0], ino), 3*blockSize+100)
			flipBit(t, dataPath(e.dirs[0], ino), 9*blockSize+7)
			off, data := 3*blockSize+50, pattern(9, 6*blockSize+100)
			if err := p.gwrite(p.a, ino, uint64(off), data, true); err != nil {
				t.Fatalf("partial group write over bad blocks: %v", err)
			}
			copy(want[off:], data)
			if got := p.sameCopies(ino); !bytes.Equal(got, want) {
				t.Fatal("copies hold other bytes than written")
			}
			if g := p.meta.group(1); g.State != rpc.GroupInSync {
				t.Fatalf("group %s after the write, want in sync", rpc.GroupStateName(g.State))
			}
		})
	}
}
