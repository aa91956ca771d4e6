package meta

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

var testKey = []byte("test-cluster-key")

func testConfig(t testing.TB, dir string) Config {
	if dir == "" {
		dir = t.TempDir()
	}
	return Config{DataDir: dir, ListenAddr: "127.0.0.1:0", ClusterKey: testKey}
}

func openService(t testing.TB, cfg Config) *Service {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// client is a test client with a session and a request sequence.
type client struct {
	t   testing.TB
	c   *transport.Client
	id  uint64
	seq atomic.Uint64
	now atomic.Int64 // the service's time in the last heartbeat answer
}

func newClient(t testing.TB, addr string) *client {
	t.Helper()
	c := &client{t: t, c: transport.NewClient(addr, transport.ClientConfig{Key: testKey, Conns: 4})}
	t.Cleanup(func() { c.c.Close() })
	var resp rpc.SessionOpenResp
	if err := c.call(rpc.MSessionOpen, &rpc.SessionOpenReq{Host: "test", MountPoint: "/t", Pid: 1}, &resp); err != nil {
		t.Fatalf("session open: %v", err)
	}
	c.id = resp.ClientID
	return c
}

func (c *client) call(m rpc.Method, req, resp rpc.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return c.c.Call(ctx, m, req, resp)
}

// heartbeat reports open as the session's open files, listed after the
// last heartbeat answer (as the real client does).
func (c *client) heartbeat(open ...uint64) error {
	var resp rpc.SessionHeartbeatResp
	err := c.call(rpc.MSessionHeartbeat, &rpc.SessionHeartbeatReq{ClientID: c.id, OpenInodes: open, ListedAfter: c.now.Load()}, &resp)
	if err == nil {
		c.now.Store(resp.Now)
	}
	return err
}

func (c *client) hdr() rpc.ReqHeader { return rpc.ReqHeader{ClientID: c.id, Seq: c.seq.Add(1)} }

func (c *client) create(parent uint64, name string, mode uint32) (rpc.Attr, error) {
	var r rpc.ChangeResp
	err := c.call(rpc.MCreate, &rpc.CreateReq{Hdr: c.hdr(), Parent: parent, Name: name, Mode: mode}, &r)
	return r.Attr, err
}

// tmpfile makes a file with no name in parent (O_TMPFILE).
func (c *client) tmpfile(parent uint64, mode uint32) (rpc.Attr, error) {
	var r rpc.ChangeResp
	err := c.call(rpc.MTmpfile, &rpc.CreateReq{Hdr: c.hdr(), Parent: parent, Mode: mode}, &r)
	return r.Attr, err
}

func (c *client) link(ino, parent uint64, name string) (rpc.Attr, error) {
	var r rpc.LinkResp
	err := c.call(rpc.MLink, &rpc.LinkReq{Hdr: c.hdr(), Ino: ino, NewParent: parent, NewName: name}, &r)
	return r.Attr, err
}

func (c *client) mustCreate(parent uint64, name string, mode uint32) rpc.Attr {
	c.t.Helper()
	a, err := c.create(parent, name, mode)
	if err != nil {
		c.t.Fatalf("create %d/%q: %v", parent, name, err)
	}
	return a
}

func (c *client) lookup(parent uint64, name string) (rpc.Attr, error) {
	var r rpc.AttrResp
	err := c.call(rpc.MLookup, &rpc.LookupReq{Parent: parent, Name: name}, &r)
	return r.Attr, err
}

func (c *client) getattr(ino uint64) (rpc.Attr, error) {
	var r rpc.AttrResp
	err := c.call(rpc.MGetAttr, &rpc.GetAttrReq{Ino: ino}, &r)
	return r.Attr, err
}

func (c *client) mustGetattr(ino uint64) rpc.Attr {
	c.t.Helper()
	a, err := c.getattr(ino)
	if err != nil {
		c.t.Fatalf("getattr %d: %v", ino, err)
	}
	return a
}

func (c *client) unlink(parent uint64, name string) (rpc.Attr, error) {
	var r rpc.AttrResp
	err := c.call(rpc.MUnlink, &rpc.EntryReq{Hdr: c.hdr(), Parent: parent, Name: name}, &r)
	return r.Attr, err
}

func (c *client) rmdir(parent uint64, name string) error {
	return c.call(rpc.MRmdir, &rpc.EntryReq{Hdr: c.hdr(), Parent: parent, Name: name}, nil)
}

func (c *client) rename(op uint64, on string, np uint64, nn string, flags uint32) error {
	return c.call(rpc.MRename, &rpc.RenameReq{Hdr: c.hdr(), OldParent: op, OldName: on, NewParent: np, NewName: nn, Flags: flags}, nil)
}

func (c *client) readdirAll(dir uint64, limit uint32, plus bool) ([]rpc.DirEntry, error) {
	var out []rpc.DirEntry
	after := ""
	for {
		var r rpc.ReadDirResp
		if err := c.call(rpc.MReadDir, &rpc.ReadDirReq{Dir: dir, After: after, Limit: limit, Plus: plus}, &r); err != nil {
			return out, err
		}
		out = append(out, r.Entries...)
		if len(r.Entries) > 0 {
			after = r.Entries[len(r.Entries)-1].Name
		}
		if r.EOF {
			return out, nil
		}
		if len(r.Entries) == 0 {
			return out, fmt.Errorf("empty page without EOF")
		}
	}
}

func wantErrno(t testing.TB, err error, want syscall.Errno, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

// fakeStore is a peer double for a storage server: it answers SRemove and
// records the calls.
type fakeStore struct {
	srv  *transport.Server
	addr string
	mu   sync.Mutex
	rm   []rpc.ChunkID
	// hung, when set (hang), holds every SRemoveMany until the test ends,
	// as a stopped server would; each held call is first sent on held.
	hung chan struct{}
	held chan []rpc.ChunkID
	// calls counts SRemoveMany calls, sizes their chunk counts; the call
	// numbered failCall (from 1; 0: none) fails without removing.
	calls    int
	sizes    []int
	failCall int
}

// hang makes f answer no SRemoveMany until the test ends.
func (f *fakeStore) hang(t testing.TB) {
	f.hung, f.held = make(chan struct{}), make(chan []rpc.ChunkID, 16)
	t.Cleanup(func() { close(f.hung) })
}

func newFakeStore(t testing.TB) *fakeStore {
	f := &fakeStore{srv: transport.NewServer(testKey)}
	transport.Handle(f.srv, rpc.SRemove, func(_ context.Context, r *rpc.ChunkReq) (*rpc.Empty, error) {
		f.mu.Lock()
		f.rm = append(f.rm, r.Chunk)
		f.mu.Unlock()
		return &rpc.Empty{}, nil
	})
	transport.Handle(f.srv, rpc.SRemoveMany, func(ctx context.Context, r *rpc.ChunksReq) (*rpc.Empty, error) {
		if f.hung != nil {
			select {
			case f.held <- r.Chunks:
			default:
			}
			select {
			case <-f.hung:
			case <-ctx.Done():
			}
			return nil, fmt.Errorf("fake store hung")
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.calls++
		f.sizes = append(f.sizes, len(r.Chunks))
		if f.calls == f.failCall {
			return nil, rpc.Errorf(syscall.EIO, "fake store: call %d fails", f.calls)
		}
		f.rm = append(f.rm, r.Chunks...)
		return &rpc.Empty{}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	go f.srv.Serve(ln)
	t.Cleanup(func() { f.srv.Close() })
	return f
}

func (f *fakeStore) removed() []rpc.ChunkID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]rpc.ChunkID(nil), f.rm...)
}

// registerTargets registers a server with n targets and returns their ids.
func (c *client) registerTargets(addr string, uuids ...string) rpc.RegisterServerResp {
	c.t.Helper()
	return c.registerTargetsOn(addr, 0, uuids...)
}

// registerTargetsOn registers targets of 1 TiB (half free) that all live on
// the file system fsid (0: unknown, and no root reserve reported) of host
// "h".
func (c *client) registerTargetsOn(addr string, fsid uint64, uuids ...string) rpc.RegisterServerResp {
	c.t.Helper()
	req := &rpc.RegisterServerReq{Addr: addr, Host: "h"}
	for _, u := range uuids {
		tr := rpc.TargetReg{UUID: u, Path: "/t/" + u, TotalBytes: 1 << 40, FreeBytes: 1 << 39, FSID: fsid}
		if fsid != 0 {
			tr.RawFree = 1<<39 + 1<<30 // 1 GiB reserved for root
		}
		req.Targets = append(req.Targets, tr)
	}
	var resp rpc.RegisterServerResp
	if err := c.call(rpc.MRegisterServer, req, &resp); err != nil {
		c.t.Fatalf("register: %v", err)
	}
	return resp
}
