package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// groupRig stands in for the store side of mirror groups, which these
// tests do not exercise: two real transport servers on loopback answer the
// storage methods for group chunks as docs/design/0014 has stores answer —
// ESTALE for an epoch older than the server's, or a mutation (or a read of
// an out-of-sync copy) at a copy that is not the primary; EAGAIN for an
// epoch newer than the server has learnt — and keep both copies' bytes in
// one map (forwarding to the secondary is the store's business). The rig
// also holds the group map the client fetches (its groupMap.list is
// pointed here, as the metadata service on this branch has no groups).
//
// Group 1: primary target 11 on server 0, secondary 12 on server 1.
// Group 2: primary target 21 on server 1, secondary 22 on server 0.
type groupRig struct {
	t   *testing.T
	key []byte
	mu  sync.Mutex
	// groups is the service's map; lists counts the client's fetches.
	groups map[uint32]*rpc.GroupInfo
	lists  int
	data   map[[2]uint64][]byte // (group, ino) → chunk bytes, both copies
	srv    [2]*rigServer
}

type rigServer struct {
	rig     *groupRig
	i       int
	addr    string // as the group map names it
	targets map[uint32]bool
	ts      *transport.Server
	// Under rig.mu:
	know    map[uint32]rigCopy // what the server learnt of each group
	readEIO bool               // reads answer EIO (a bad block)
	// readEAGAIN: reads answer EAGAIN (a secondary's chunk left unsure by
	// an unclean stop, until its primary has it re-copied).
	readEAGAIN bool
	hang       chan struct{} // not nil: requests wait until it is closed
	calls      []rigCall
	down       bool
}

// rigCopy is a server's view of a group it holds a copy of.
type rigCopy struct {
	epoch   uint64
	primary bool // acts as primary in epoch
	reads   bool // may serve reads (primary, or in sync)
}

// rigCall is a request a rig server saw, and what it answered.
type rigCall struct {
	m     rpc.Method
	group uint32
	ino   uint64
	epoch uint64
	errno syscall.Errno
}

// newGroupRig starts the two servers. network: the map names them by an
// address the transport does not serve in-process ("localhost:PORT"), so
// calls go over TCP; else by their listen address, as in strata up.
func newGroupRig(t *testing.T, network bool) *groupRig {
	r := &groupRig{t: t, key: []byte("test-cluster-key"), groups: map[uint32]*rpc.GroupInfo{}, data: map[[2]uint64][]byte{}}
	for i := range r.srv {
		s := &rigServer{rig: r, i: i, know: map[uint32]rigCopy{}, targets: map[uint32]bool{}}
		s.ts = transport.NewServer(r.key)
		transport.Handle(s.ts, rpc.SWrite, func(ctx context.Context, q *rpc.WriteReq) (*rpc.WriteResp, error) {
			if err := s.check(rpc.SWrite, q.Chunk); err != nil {
				return nil, err
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			k := [2]uint64{uint64(q.Chunk.Target &^ rpc.GroupBit), q.Chunk.Ino}
			b := r.data[k]
			if end := int(q.Off) + len(q.Data); end > len(b) {
				b = append(b, make([]byte, end-len(b))...)
			}
			copy(b[q.Off:], q.Data)
			r.data[k] = b
			return &rpc.WriteResp{Alloc: uint64(len(b)), HasAlloc: true}, nil
		})
		transport.Handle(s.ts, rpc.SRead, func(ctx context.Context, q *rpc.ReadReq) (*rpc.ReadResp, error) {
			if err := s.check(rpc.SRead, q.Chunk); err != nil {
				return nil, err
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			b := r.data[[2]uint64{uint64(q.Chunk.Target &^ rpc.GroupBit), q.Chunk.Ino}]
			if int(q.Off) >= len(b) {
				return &rpc.ReadResp{}, nil
			}
			return &rpc.ReadResp{Data: bytes.Clone(b[q.Off:min(len(b), int(q.Off)+int(q.Len))])}, nil
		})
		transport.Handle(s.ts, rpc.STruncate, func(ctx context.Context, q *rpc.TruncateReq) (*rpc.Empty, error) {
			if err := s.check(rpc.STruncate, q.Chunk); err != nil {
				return nil, err
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			k := [2]uint64{uint64(q.Chunk.Target &^ rpc.GroupBit), q.Chunk.Ino}
			b := r.data[k]
			if int(q.Size) <= len(b) {
				r.data[k] = b[:q.Size]
			} else {
				r.data[k] = append(b, make([]byte, int(q.Size)-len(b))...)
			}
			return &rpc.Empty{}, nil
		})
		transport.Handle(s.ts, rpc.SPunch, func(ctx context.Context, q *rpc.PunchReq) (*rpc.Empty, error) {
			if err := s.check(rpc.SPunch, q.Chunk); err != nil {
				return nil, err
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			b := r.data[[2]uint64{uint64(q.Chunk.Target &^ rpc.GroupBit), q.Chunk.Ino}]
			if int(q.Off) < len(b) {
				clear(b[q.Off:min(len(b), int(q.Off+q.Len))])
			}
			return &rpc.Empty{}, nil
		})
		stat := func(m rpc.Method) func(context.Context, *rpc.ChunkReq) (*rpc.ChunkStatResp, error) {
			return func(ctx context.Context, q *rpc.ChunkReq) (*rpc.ChunkStatResp, error) {
				if err := s.check(m, q.Chunk); err != nil {
					return nil, err
				}
				r.mu.Lock()
				defer r.mu.Unlock()
				b, ok := r.data[[2]uint64{uint64(q.Chunk.Target &^ rpc.GroupBit), q.Chunk.Ino}]
				return &rpc.ChunkStatResp{Size: uint64(len(b)), Exists: ok, Alloc: uint64(len(b)), HasAlloc: true}, nil
			}
		}
		transport.Handle(s.ts, rpc.SSyncStat, stat(rpc.SSyncStat))
		transport.Handle(s.ts, rpc.SChunkStat, stat(rpc.SChunkStat))
		transport.Handle(s.ts, rpc.SSync, func(ctx context.Context, q *rpc.ChunkReq) (*rpc.Empty, error) {
			return &rpc.Empty{}, s.check(rpc.SSync, q.Chunk)
		})
		transport.Handle(s.ts, rpc.SSeek, func(ctx context.Context, q *rpc.SeekReq) (*rpc.SeekResp, error) {
			if err := s.check(rpc.SSeek, q.Chunk); err != nil {
				return nil, err
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			n := uint64(len(r.data[[2]uint64{uint64(q.Chunk.Target &^ rpc.GroupBit), q.Chunk.Ino}]))
			if q.Data {
				return &rpc.SeekResp{Off: q.Off, Found: q.Off < n}, nil
			}
			return &rpc.SeekResp{Off: max(q.Off, n), Found: true}, nil
		})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.addr = ln.Addr().String()
		if network {
			s.addr = fmt.Sprintf("localhost:%d", ln.Addr().(*net.TCPAddr).Port)
		}
		go func() { _ = s.ts.Serve(ln) }()
		r.srv[i] = s
	}
	r.srv[0].targets[11], r.srv[1].targets[12] = true, true
	r.srv[1].targets[21], r.srv[0].targets[22] = true, true
	r.groups[1] = &rpc.GroupInfo{ID: 1, Epoch: 5, Primary: 11, Secondary: 12, State: rpc.GroupInSync,
		PrimaryAddr: r.srv[0].addr, SecondaryAddr: r.srv[1].addr, PrimaryAlive: true, SecondaryAlive: true}
	r.groups[2] = &rpc.GroupInfo{ID: 2, Epoch: 9, Primary: 21, Secondary: 22, State: rpc.GroupInSync,
		PrimaryAddr: r.srv[1].addr, SecondaryAddr: r.srv[0].addr, PrimaryAlive: true, SecondaryAlive: true}
	for i := range r.srv {
		r.learn(i, 1)
		r.learn(i, 2)
	}
	t.Cleanup(func() {
		for _, s := range r.srv {
			r.mu.Lock()
			if s.hang != nil {
				close(s.hang)
				s.hang = nil
			}
			r.mu.Unlock()
			s.ts.Close()
		}
	})
	return r
}

// check records a request and answers what the server's view of the
// group makes of it (nil: serve it).
func (s *rigServer) check(m rpc.Method, ch rpc.ChunkID) error {
	r := s.rig
	r.mu.Lock()
	hang := s.hang
	r.mu.Unlock()
	if hang != nil {
		<-hang
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	g := ch.Target &^ rpc.GroupBit
	k, ok := s.know[g]
	var err error
	switch {
	case !rpc.IsGroup(ch.Target) || !ok:
		err = rpc.Errorf(syscall.ENOENT, "no copy of %d here", ch.Target)
	case ch.Epoch < k.epoch:
		err = rpc.Errorf(syscall.ESTALE, "group %d epoch %d < %d", g, ch.Epoch, k.epoch)
	case ch.Epoch > k.epoch:
		err = rpc.Errorf(syscall.EAGAIN, "group %d epoch %d not known yet (%d)", g, ch.Epoch, k.epoch)
	case !readMethod(m) && !k.primary, readMethod(m) && !k.reads:
		err = rpc.Errorf(syscall.ESTALE, "not the primary of group %d", g)
	case m == rpc.SRead && s.readEIO:
		err = rpc.Errorf(syscall.EIO, "checksum mismatch")
	case m == rpc.SRead && s.readEAGAIN:
		err = rpc.Errorf(syscall.EAGAIN, "chunk unsure since an unclean stop")
	}
	s.calls = append(s.calls, rigCall{m: m, group: g, ino: ch.Ino, epoch: ch.Epoch, errno: rpc.ErrnoOf(err)})
	if err == nil {
		s.calls[len(s.calls)-1].errno = 0
	}
	return err
}

// learn makes server i take group g's state from the service's map.
func (r *groupRig) learn(i int, g uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	gi := r.groups[g]
	s := r.srv[i]
	primary := s.targets[gi.Primary]
	s.know[g] = rigCopy{epoch: gi.Epoch, primary: primary, reads: primary || gi.State == rpc.GroupInSync}
}

// failOver makes group g's secondary its primary in the service's map
// (degraded, new epoch), as the metadata leader does when the primary's
// server stops heartbeating; the servers learn it only by learn.
func (r *groupRig) failOver(g uint32) { r.switchOver(g, rpc.GroupDegraded) }

// switchOver swaps group g's copies in the service's map, with state st
// and a new epoch (in sync: a planned fail-over).
func (r *groupRig) switchOver(g uint32, st uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	gi := r.groups[g]
	gi.Primary, gi.Secondary = gi.Secondary, gi.Primary
	gi.PrimaryAddr, gi.SecondaryAddr = gi.SecondaryAddr, gi.PrimaryAddr
	gi.State = st
	gi.Epoch++
}

// setState sets group g's state (new epoch) in the service's map.
func (r *groupRig) setState(g uint32, st uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups[g].State = st
	r.groups[g].Epoch++
}

// list answers the rig's map, of unknown version (as an older service).
func (r *groupRig) list(ctx context.Context) ([]rpc.GroupInfo, rpc.MapVersion, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists++
	var out []rpc.GroupInfo
	for g := uint32(1); g <= 2; g++ {
		out = append(out, *r.groups[g])
	}
	return out, 0, nil
}

// calls returns what server i saw and forgets it.
func (r *groupRig) calls(i int) []rigCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.srv[i].calls
	r.srv[i].calls = nil
	return out
}

// answered reports whether server i answered a call with errno (without
// taking its calls, as calls does).
func (r *groupRig) answered(i int, errno syscall.Errno) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cl := range r.srv[i].calls {
		if cl.errno == errno {
			return true
		}
	}
	return false
}

// attach points c's group map at the rig (holding the refresh lock, which
// every refresh takes before it reads list) and fetches it.
func (r *groupRig) attach(c *Client) {
	r.t.Helper()
	if err := c.groups.lockRefresh(bg); err != nil {
		r.t.Fatal(err)
	}
	c.groups.list = r.list
	c.groups.unlockRefresh()
	if err := c.groups.refresh(bg); err != nil {
		r.t.Fatal(err)
	}
}

// mirroredFile creates a file in a real cluster and gives its open inode
// a layout of the rig's two groups (1 MiB stripes) before any I/O: the
// metadata service on this branch cannot place a file on groups.
func mirroredFile(t *testing.T, c *Client, name string) *File {
	t.Helper()
	f := create(t, c, RootIno, name, syscall.O_RDWR)
	if n := len(f.in.layout.Targets); n != 2 {
		t.Fatalf("file has %d slots, want 2", n)
	}
	f.in.layout = layout.Layout{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{rpc.GroupBit | 1, rpc.GroupBit | 2}}
	return f
}

// groupCluster is a real metadata service and store (for sessions,
// namespace and size commits), a client with a short bounded wait, and a
// rig serving the groups.
func groupCluster(t *testing.T, network bool, ioTimeout time.Duration) (*Client, *groupRig) {
	tc := startCluster(t, clusterOpts{stores: 1, targets: 2})
	c := tc.client(func(cfg *Config) { cfg.IOTimeout = ioTimeout })
	r := newGroupRig(t, network)
	r.attach(c)
	return c, r
}

func writeSync(t *testing.T, f *File, data []byte) {
	t.Helper()
	if _, err := f.WriteAt(bg, data, 0); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := f.Fsync(bg); err != nil {
		t.Fatalf("fsync: %v", err)
	}
}

func checkRead(t *testing.T, f *File, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	for off := 0; off < len(want); off += 1 << 20 { // sequential: read-ahead works
		n, err := f.ReadAt(bg, got[off:min(len(want), off+1<<20)], int64(off))
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if n != min(len(want)-off, 1<<20) {
			t.Fatalf("read at %d: %d bytes", off, n)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read back other bytes than written")
	}
}

// TestGroupRouting: mutations of a group slot go to the primary's server
// with the group's epoch, never to the secondary; reads of an in-sync
// group reach both copies; reads of a degraded group only its primary.
func TestGroupRouting(t *testing.T) {
	for _, network := range []bool{false, true} {
		t.Run(fmt.Sprintf("network=%v", network), func(t *testing.T) {
			c, r := groupCluster(t, network, 10*time.Second)
			f := mirroredFile(t, c, "m")
			defer f.Release(bg)
			data := pattern(3, 0, 16<<20)
			writeSync(t, f, data)
			if err := f.Punch(bg, 1<<20, 4096); err != nil {
				t.Fatalf("punch: %v", err)
			}
			clear(data[1<<20 : 1<<20+4096])
			if _, err := c.SetAttr(bg, f.Ino(), rpc.SetAttrReq{Valid: rpc.SetSize, Size: 15 << 20}); err != nil {
				t.Fatalf("truncate: %v", err)
			}
			data = data[:15<<20]
			if err := f.Fsync(bg); err != nil {
				t.Fatalf("fsync: %v", err)
			}
			epochs := map[uint32]uint64{1: 5, 2: 9}
			primary := map[uint32]int{1: 0, 2: 1}
			mutations := map[rpc.Method]int{}
			for i := range r.srv {
				for _, cl := range r.calls(i) {
					if cl.errno != 0 || cl.epoch != epochs[cl.group] {
						t.Fatalf("server %d: %+v, want epoch %d and success", i, cl, epochs[cl.group])
					}
					if !readMethod(cl.m) {
						if primary[cl.group] != i {
							t.Fatalf("mutation %d of group %d at server %d, not its primary", cl.m, cl.group, i)
						}
						mutations[cl.m]++
					}
				}
			}
			for _, m := range []rpc.Method{rpc.SWrite, rpc.SSyncStat, rpc.SPunch, rpc.STruncate} {
				if mutations[m] == 0 {
					t.Fatalf("no call of method %d reached a primary: %v", m, mutations)
				}
			}
			// Each group's chunk is read from the one copy spreadKey picks.
			reads := readBackCounted(t, c, r, f.Ino(), data)
			for g := uint32(1); g <= 2; g++ {
				want := 0
				if (spreadKey(f.Ino(), g)&1 == 1) == (primary[g] == 0) {
					want = 1 // the secondary's server
				}
				if reads[want][g] == 0 || reads[1-want][g] != 0 {
					t.Fatalf("reads of in-sync group %d: %d at server 0, %d at server 1; want all at server %d", g, reads[0][g], reads[1][g], want)
				}
			}
			if off, err := f.Seek(bg, 0, true); err != nil || off != 0 {
				t.Fatalf("seek data: %d, %v", off, err)
			}
			r.calls(0) // the seek's, at either copy of the in-sync groups
			r.calls(1)
			// Group 1 degrades (its secondary is away): only the primary
			// serves its reads, in the new epoch.
			r.setState(1, rpc.GroupDegraded)
			r.learn(0, 1)
			r.learn(1, 1)
			if err := c.groups.refresh(bg); err != nil {
				t.Fatal(err)
			}
			f3, err := c.Open(bg, f.Ino(), syscall.O_RDONLY)
			if err != nil {
				t.Fatal(err)
			}
			checkRead(t, f3, data)
			f3.Release(bg)
			for _, cl := range r.calls(1) {
				if cl.group == 1 {
					t.Fatalf("degraded group 1 asked at its secondary's server: %+v", cl)
				}
			}
		})
	}
}

// readBackCounted reads inode ino sequentially through a new handle,
// checks that it holds want, and counts the reads each rig server answered
// of its chunks, by group; every call the servers saw is forgotten.
func readBackCounted(t *testing.T, c *Client, r *groupRig, ino uint64, want []byte) [2]map[uint32]int {
	t.Helper()
	f, err := c.Open(bg, ino, syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	checkRead(t, f, want)
	f.Release(bg)
	reads := [2]map[uint32]int{{}, {}}
	for i := range r.srv {
		for _, cl := range r.calls(i) {
			if cl.m == rpc.SRead && cl.ino == ino && cl.errno == 0 {
				reads[i][cl.group]++
			}
		}
	}
	return reads
}

// TestGroupReadsSpreadByChunk: a sequential read of a mirrored file reads
// each chunk from one copy (so that each copy's store reads its chunk file
// front to back, never the rows the other copy serves), and files of
// consecutive inodes use the other copy of each group: over two files
// every copy serves reads.
func TestGroupReadsSpreadByChunk(t *testing.T) {
	c, r := groupCluster(t, false, 10*time.Second)
	var files []*File
	parity := map[uint64]bool{}
	for i := 0; i < 8 && len(parity) < 2; i++ {
		f := mirroredFile(t, c, fmt.Sprintf("s%d", i))
		defer f.Release(bg)
		if !parity[f.Ino()&1] {
			parity[f.Ino()&1] = true
			files = append(files, f)
		}
	}
	if len(files) != 2 {
		t.Fatalf("8 creates gave no two inodes of different parity")
	}
	used := map[[2]uint32]int{} // (server, group) → reads, over both files
	for _, f := range files {
		data := pattern(byte(f.Ino()), 0, 12<<20) // 6 rows of 2 slots
		writeSync(t, f, data)
		r.calls(0)
		r.calls(1)
		reads := readBackCounted(t, c, r, f.Ino(), data)
		for grp := uint32(1); grp <= 2; grp++ {
			if reads[0][grp] != 0 && reads[1][grp] != 0 {
				t.Fatalf("inode %d: group %d's chunk read from both copies (%d at server 0, %d at server 1)", f.Ino(), grp, reads[0][grp], reads[1][grp])
			}
			for i := range reads {
				used[[2]uint32{uint32(i), grp}] += reads[i][grp]
			}
		}
	}
	for i := uint32(0); i < 2; i++ {
		for grp := uint32(1); grp <= 2; grp++ {
			if used[[2]uint32{i, grp}] == 0 {
				t.Fatalf("no read of group %d at server %d over two files: %v", grp, i, used)
			}
		}
	}
}

// TestGroupSwitchWhileWriting: the group switches while writes are
// buffered; the old primary refuses the old epoch (ESTALE) and the new
// one has not learnt it yet (EAGAIN) for a while. The writes and the
// fsync succeed on the new primary, and the bytes read back.
func TestGroupSwitchWhileWriting(t *testing.T) {
	c, r := groupCluster(t, false, 10*time.Second)
	f := mirroredFile(t, c, "sw")
	defer f.Release(bg)
	data := pattern(5, 0, 8<<20)
	if _, err := f.WriteAt(bg, data[:4<<20], 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(bg); err != nil {
		t.Fatal(err)
	}
	r.failOver(1)
	r.learn(0, 1) // the old primary knows it is deposed
	// The new primary learns its epoch once it has answered a write of it
	// EAGAIN (or after 5 s): not after a fixed 300 ms, which a loaded
	// machine's writes could take to arrive (CI at load 40).
	learnt := make(chan struct{})
	go func() {
		defer close(learnt)
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if r.answered(1, syscall.EAGAIN) {
				r.learn(1, 1)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		r.learn(1, 1)
	}()
	writeSync(t, f, data)
	<-learnt
	checkRead(t, f, data)
	var stale, again, newEpoch int
	for i := range r.srv {
		for _, cl := range r.calls(i) {
			switch {
			case cl.errno == syscall.ESTALE:
				stale++
			case cl.errno == syscall.EAGAIN:
				again++
			case cl.group == 1 && cl.m == rpc.SWrite && cl.errno == 0 && cl.epoch == 6:
				if i != 1 {
					t.Fatalf("write of group 1 in epoch 6 at server %d", i)
				}
				newEpoch++
			}
		}
	}
	if stale == 0 || again == 0 || newEpoch == 0 {
		t.Fatalf("ESTALE answers %d, EAGAIN answers %d, writes at the new primary %d: the switch was not exercised", stale, again, newEpoch)
	}
}

// TestGroupPrimaryDown: the primary's server is gone (its port closed);
// the group fails over a little later. The writes buffered meanwhile and
// the fsync succeed on the new primary.
func TestGroupPrimaryDown(t *testing.T) {
	c, r := groupCluster(t, true, 10*time.Second)
	f := mirroredFile(t, c, "down")
	defer f.Release(bg)
	data := pattern(7, 0, 4<<20)
	writeSync(t, f, data[:2<<20])
	r.srv[0].ts.Close() // holds group 1's primary and group 2's secondary
	time.AfterFunc(500*time.Millisecond, func() {
		r.failOver(1)
		r.setState(2, rpc.GroupDegraded)
		r.learn(1, 1)
		r.learn(1, 2)
	})
	start := time.Now()
	writeSync(t, f, data)
	t.Logf("write+fsync with the primary gone and the switch at 500 ms: %v", time.Since(start).Round(time.Millisecond))
	checkRead(t, f, data)
}

// TestGroupHungPrimary: the primary's server hangs with its connections
// open (a SIGSTOP); once the group fails over, the calls waiting on the
// hung server are given up and sent to the new primary, long before the
// bounded wait would fail them.
func TestGroupHungPrimary(t *testing.T) {
	c, r := groupCluster(t, true, 30*time.Second)
	f := mirroredFile(t, c, "hung")
	defer f.Release(bg)
	data := pattern(9, 0, 4<<20)
	writeSync(t, f, data[:2<<20])
	r.mu.Lock()
	r.srv[0].hang = make(chan struct{})
	r.mu.Unlock()
	time.AfterFunc(300*time.Millisecond, func() {
		r.failOver(1)
		r.setState(2, rpc.GroupDegraded)
		r.learn(1, 1)
		r.learn(1, 2)
	})
	ctx, cancel := context.WithTimeout(bg, 15*time.Second) // half the bounded wait
	defer cancel()
	if _, err := f.WriteAt(ctx, data, 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := f.Fsync(ctx); err != nil {
		t.Fatalf("fsync with the primary hung: %v", err)
	}
	t.Logf("fsync with the primary hung and the switch at 300 ms: %v", time.Since(start).Round(time.Millisecond))
	checkRead(t, f, data)
}

// TestGroupReadOtherCopyOnEIO: a copy whose reads fail their checksums
// (EIO) has its reads served by the other copy of the in-sync group; with
// both bad the read fails with EIO naming the group.
func TestGroupReadOtherCopyOnEIO(t *testing.T) {
	c, r := groupCluster(t, false, 10*time.Second)
	f := mirroredFile(t, c, "eio")
	defer f.Release(bg)
	data := pattern(11, 0, 8<<20)
	writeSync(t, f, data)
	// The bad copy is the server this file's reads of group 1 go to first.
	rt, _ := c.groups.route(rpc.GroupBit|1, true, spreadKey(f.Ino(), 1), 0)
	bad := 0
	if rt.copy == 12 {
		bad = 1
	}
	r.mu.Lock()
	r.srv[bad].readEIO = true
	r.mu.Unlock()
	f2, err := c.Open(bg, f.Ino(), syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	checkRead(t, f2, data)
	f2.Release(bg)
	eio := 0
	for _, cl := range r.calls(bad) {
		if cl.errno == syscall.EIO {
			eio++
		}
	}
	if eio == 0 {
		t.Fatal("no read reached the bad copy: the retry was not exercised")
	}
	r.mu.Lock()
	r.srv[1-bad].readEIO = true
	r.mu.Unlock()
	f3, err := c.Open(bg, f.Ino(), syscall.O_RDONLY|syscall.O_DIRECT)
	if err != nil {
		t.Fatal(err)
	}
	defer f3.Release(bg)
	_, err = f3.ReadAt(bg, make([]byte, 4096), 0)
	var te *TargetError
	if !errors.Is(err, syscall.EIO) || !errors.As(err, &te) || te.Target != rpc.GroupBit|1 {
		t.Fatalf("read with both copies bad: %v, want EIO on group 1", err)
	}
}

// TestGroupReadOtherCopyOnEAGAIN: a copy of an in-sync group that cannot
// serve a read now (EAGAIN: its chunk unsure since an unclean stop) has
// the read served by the other copy at once, not asked again until the
// I/O timeout (10 s here: the read would fail).
func TestGroupReadOtherCopyOnEAGAIN(t *testing.T) {
	c, r := groupCluster(t, false, 10*time.Second)
	f := mirroredFile(t, c, "eagain")
	defer f.Release(bg)
	data := pattern(12, 0, 4<<20)
	writeSync(t, f, data)
	rt, _ := c.groups.route(rpc.GroupBit|1, true, spreadKey(f.Ino(), 1), 0)
	unsure := 0
	if rt.copy == 12 {
		unsure = 1
	}
	r.mu.Lock()
	r.srv[unsure].readEAGAIN = true
	r.mu.Unlock()
	f2, err := c.Open(bg, f.Ino(), syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Release(bg)
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	got := make([]byte, len(data))
	if _, err := f2.ReadAt(ctx, got, 0); err != nil {
		t.Fatalf("read with one copy answering EAGAIN: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read back wrong bytes")
	}
	again := 0
	for _, cl := range r.calls(unsure) {
		if cl.errno == syscall.EAGAIN {
			again++
		}
	}
	if again == 0 {
		t.Fatal("no read reached the unsure copy: the retry was not exercised")
	}
}

// TestGroupUnavailableIsEIO: a group that keeps answering ESTALE (a map
// that never catches up) or whose servers are both gone fails its data
// operations with EIO after the bounded wait — never ESTALE or EAGAIN,
// which the kernel would misread.
func TestGroupUnavailableIsEIO(t *testing.T) {
	c, r := groupCluster(t, false, 1500*time.Millisecond)
	f := mirroredFile(t, c, "gone")
	defer f.Release(bg)
	writeSync(t, f, pattern(13, 0, 2<<20))
	r.mu.Lock()
	r.srv[0].know[1] = rigCopy{epoch: 99, primary: true, reads: true} // ahead of every map
	r.mu.Unlock()
	_, err := f.WriteAt(bg, pattern(13, 0, 4096), 0)
	if err == nil {
		err = f.Fsync(bg)
	}
	var te *TargetError
	if !errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ESTALE) || !errors.As(err, &te) || te.Target != rpc.GroupBit|1 {
		t.Fatalf("write to a group answering ESTALE: %v, want EIO on group 1", err)
	}
	for _, s := range r.srv {
		s.ts.Close()
	}
	f2, err := c.Open(bg, f.Ino(), syscall.O_RDONLY|syscall.O_DIRECT)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Release(bg)
	if _, err := f2.ReadAt(bg, make([]byte, 4096), 1<<20); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read with both servers gone: %v, want EIO", err)
	}
}

// TestGroupRefreshCoalesces: callers that saw an error at the same time
// share one refresh; a caller whose error came after a refresh began
// waits for a newer one.
func TestGroupRefreshCoalesces(t *testing.T) {
	c, r := groupCluster(t, false, 10*time.Second)
	r.mu.Lock()
	r.lists = 0
	r.mu.Unlock()
	mark := c.groups.mark()
	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.groups.refreshAfter(bg, mark); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	r.mu.Lock()
	n := r.lists
	r.mu.Unlock()
	if failed.Load() != 0 || n != 1 {
		t.Fatalf("32 callers with one mark: %d refreshes, %d failed; want 1, 0", n, failed.Load())
	}
	if err := c.groups.refreshAfter(bg, c.groups.mark()); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	n = r.lists
	r.mu.Unlock()
	if n != 2 {
		t.Fatalf("a caller with a newer mark: %d refreshes, want 2", n)
	}
	// A refresh stuck on the service holds a caller behind it no longer
	// than the caller's context allows.
	release := make(chan struct{})
	entered := make(chan struct{})
	if err := c.groups.lockRefresh(bg); err != nil {
		t.Fatal(err)
	}
	c.groups.list = func(ctx context.Context) ([]rpc.GroupInfo, rpc.MapVersion, error) {
		close(entered)
		<-release
		return r.list(ctx)
	}
	c.groups.unlockRefresh()
	stuck := make(chan error, 1)
	go func() { stuck <- c.groups.refresh(bg) }()
	<-entered
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	err := c.groups.refreshAfter(ctx, c.groups.mark())
	cancel()
	close(release)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting behind a stuck refresh: %v, want the caller's deadline", err)
	}
	if err := <-stuck; err != nil {
		t.Fatal(err)
	}
}

// TestGroupRouteSpread: reads of an in-sync group split about evenly
// between the copies over inodes; a copy to avoid is avoided;
// mutations and reads of a group not in sync go to the primary.
func TestGroupRouteSpread(t *testing.T) {
	c, r := groupCluster(t, false, 10*time.Second)
	var sec int
	const n = 4096
	for i := 0; i < n; i++ {
		rt, ok := c.groups.route(rpc.GroupBit|1, true, spreadKey(uint64(1000+i), 1), 0)
		if !ok || !rt.both || rt.epoch != 5 {
			t.Fatalf("route: %+v %v", rt, ok)
		}
		if rt.copy == 12 {
			sec++
		}
		if rt2, _ := c.groups.route(rpc.GroupBit|1, true, spreadKey(uint64(1000+i), 1), rt.copy); rt2.copy == rt.copy {
			t.Fatalf("route avoiding %d chose it", rt.copy)
		}
	}
	if sec < n*2/5 || sec > n*3/5 {
		t.Fatalf("%d of %d reads at the secondary", sec, n)
	}
	// A copy a read found unreachable is asked last for a while.
	c.groups.noteUnreachable(12)
	for i := 0; i < 64; i++ {
		if rt, _ := c.groups.route(rpc.GroupBit|1, true, spreadKey(uint64(i), 1), 0); rt.copy != 11 {
			t.Fatalf("read routed to %d, found unreachable", rt.copy)
		}
	}
	c.groups.mu.Lock()
	c.groups.mu.unreachable[12] = time.Now() // passed
	c.groups.mu.Unlock()
	if rt, _ := c.groups.route(rpc.GroupBit|1, true, 1, 0); rt.copy != 12 {
		t.Fatalf("read routed to %d after the copy's time out of favour", rt.copy)
	}
	for _, read := range []bool{false, true} {
		if read {
			r.setState(1, rpc.GroupResyncing)
			if err := c.groups.refresh(bg); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < 64; i++ {
			rt, _ := c.groups.route(rpc.GroupBit|1, read, spreadKey(uint64(i), 1), 0)
			if rt.copy != 11 || rt.addr != r.srv[0].addr {
				t.Fatalf("read=%v: routed to %+v, want the primary", read, rt)
			}
		}
	}
}

// TestGroupSwitchUnderLoad: writers that fsync every record and readers
// that check what was fsynced run while both groups switch back and forth
// (planned fail-overs: the old primary refuses the old epoch at once, the
// new one learns the epoch a little later). No operation fails, and every
// byte reads back.
func TestGroupSwitchUnderLoad(t *testing.T) {
	c, r := groupCluster(t, true, 20*time.Second)
	const writers, records, rec = 4, 8, 1 << 20
	files := make([]*File, writers)
	for i := range files {
		files[i] = mirroredFile(t, c, fmt.Sprintf("load%d", i))
		defer files[i].Release(bg)
	}
	var synced [writers]atomic.Int64 // records fsynced per file
	var longest atomic.Int64         // the longest write+fsync, ns
	stop := make(chan struct{})
	switched := make(chan int)
	go func() { // the switcher: bounded by count and by stop
		n := 0
		defer func() { switched <- n }()
		for ; n < 40; n++ {
			select {
			case <-stop:
				return
			case <-time.After(40 * time.Millisecond):
			}
			g := uint32(n%2 + 1)
			r.switchOver(g, rpc.GroupInSync)
			r.mu.Lock()
			gi := *r.groups[g]
			r.mu.Unlock()
			old := 0
			if r.srv[1].targets[gi.Secondary] {
				old = 1
			}
			r.learn(old, g)
			time.Sleep(30 * time.Millisecond)
			r.learn(1-old, g)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 2*writers)
	for i := 0; i < writers; i++ {
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			for k := 0; k < records; k++ {
				start := time.Now()
				if _, err := files[i].WriteAt(bg, pattern(byte(i), int64(k*rec), rec), int64(k*rec)); err != nil {
					errs <- fmt.Errorf("writer %d record %d: %w", i, k, err)
					return
				}
				if err := files[i].Fsync(bg); err != nil {
					errs <- fmt.Errorf("writer %d fsync %d: %w", i, k, err)
					return
				}
				synced[i].Store(int64(k + 1))
				for d := int64(time.Since(start)); ; {
					if l := longest.Load(); d <= l || longest.CompareAndSwap(l, d) {
						break
					}
				}
			}
		}()
		go func() { // reader of what writer i fsynced, through its own handle
			defer wg.Done()
			f, err := c.Open(bg, files[i].Ino(), syscall.O_RDONLY|syscall.O_DIRECT)
			if err != nil {
				errs <- err
				return
			}
			defer f.Release(bg)
			buf := make([]byte, 64<<10)
			for k := 0; k < 8*records; k++ {
				n := synced[i].Load()
				if n == 0 {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				off := (int64(k) * 997 * 4096) % (n*rec - int64(len(buf)) + 1) // within what was fsynced
				clear(buf)
				got, err := f.ReadAt(bg, buf, off)
				if err != nil {
					errs <- fmt.Errorf("reader %d at %d: %w", i, off, err)
					return
				}
				if want := pattern(byte(i), off, len(buf)); got != len(buf) || !bytes.Equal(buf, want) {
					j := 0
					for j < len(buf) && buf[j] == want[j] {
						j++
					}
					errs <- fmt.Errorf("reader %d at %d: %d bytes, other bytes than fsynced from byte %d on (%d records synced, size %d)", i, off, got, j, n, f.Size())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	n := <-switched
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, f := range files {
		checkRead(t, f, func() []byte {
			var b []byte
			for k := 0; k < records; k++ {
				b = append(b, pattern(byte(i), int64(k*rec), rec)...)
			}
			return b
		}())
	}
	if n < 2 {
		t.Fatalf("only %d switches happened during the load", n)
	}
	t.Logf("%d switches during the load; the longest 1 MiB write+fsync took %v", n, time.Duration(longest.Load()).Round(time.Millisecond))
}

// TestGroupReadCopyDown: while the service still has both groups in sync
// (it has not noticed yet), a server holding one copy of each is gone;
// every read is served by the other copies, and the client then asks the
// live copies first.
func TestGroupReadCopyDown(t *testing.T) {
	c, r := groupCluster(t, true, 10*time.Second)
	f := mirroredFile(t, c, "copydown")
	defer f.Release(bg)
	data := pattern(17, 0, 8<<20)
	writeSync(t, f, data)
	r.srv[1].ts.Close() // group 1's secondary, group 2's primary
	f2, err := c.Open(bg, f.Ino(), syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Release(bg)
	checkRead(t, f2, data)
	for _, target := range []uint32{12, 21} {
		// spread target%10+1 picks the dead copy when nothing is known
		if rt, _ := c.groups.route(rpc.GroupBit|target/10, true, uint64(target%10+1), 0); rt.copy == target {
			t.Fatalf("reads of group %d still go first to target %d, found unreachable", target/10, target)
		}
	}
}

// TestGroupRealStores is the end-to-end check of this routing against a
// metadata service and stores that serve mirror groups (docs/design/0014):
// it pairs the two targets (MMirrorCreate), writes and reads a file whose
// open inode is given the group's layout, fails the group over
// (MMirrorFailOver) and writes and reads again, then kills the primary's
// server and does it once more. It skips while the service does not know
// MMirrorCreate (ENOSYS): on a branch without the metadata and store
// sides of mirror groups.
func TestGroupRealStores(t *testing.T) {
	tc := startCluster(t, clusterOpts{stores: 2, targets: 1})
	c := tc.client(func(cfg *Config) { cfg.IOTimeout = 20 * time.Second })
	var made rpc.ListGroupsResp
	err := c.metaCall(bg, rpc.MMirrorCreate, &rpc.MirrorCreateReq{Hdr: c.hdr(), Auto: true}, &made)
	if errors.Is(err, syscall.ENOSYS) {
		t.Skip("the metadata service has no mirror groups (MMirrorCreate: ENOSYS)")
	}
	if err != nil || len(made.Groups) != 1 {
		t.Fatalf("mirror create: %v, %d groups; want 1", err, len(made.Groups))
	}
	gid := made.Groups[0].ID &^ rpc.GroupBit
	if err := c.groups.refresh(bg); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.groups.epoch(rpc.GroupBit | gid); !ok {
		t.Fatalf("group %d not in the client's map after a refresh: %v", gid, c.Groups())
	}
	f := create(t, c, RootIno, "real", syscall.O_RDWR)
	defer f.Release(bg)
	f.in.layout = layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{rpc.GroupBit | gid}}
	data := pattern(19, 0, 12<<20)
	step := func(name string, upto int) {
		t.Helper()
		if _, err := f.WriteAt(bg, data[:upto], 0); err != nil {
			t.Fatalf("%s: write: %v", name, err)
		}
		if err := f.Fsync(bg); err != nil {
			t.Fatalf("%s: fsync: %v", name, err)
		}
		g, err := c.Open(bg, f.Ino(), syscall.O_RDONLY|syscall.O_DIRECT)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Release(bg)
		checkRead(t, g, data[:upto])
	}
	step("in sync", 4<<20)
	var gi rpc.GroupInfo
	if err := c.metaCall(bg, rpc.MMirrorFailOver, &rpc.MirrorGroupReq{Hdr: c.hdr(), Group: gid}, &gi); err != nil {
		t.Fatalf("fail-over: %v", err)
	}
	step("after a planned fail-over", 8<<20)
	if err := c.groups.refresh(bg); err != nil {
		t.Fatal(err)
	}
	gi = c.Groups()[gid]
	for i, s := range tc.stores {
		if s != nil && s.Addr() == gi.PrimaryAddr {
			tc.stopStore(i)
		}
	}
	step("with the primary's server gone", 12<<20)
}
