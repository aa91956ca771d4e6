package nfs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs/nfstest"
	"github.com/stratafs/strata/internal/nfs/xdr"
)

// TestWriteStability: a FILE_SYNC write is answered FILE_SYNC (after the
// client library's fsync); UNSTABLE writes are answered UNSTABLE, on sync
// and async exports, and COMMIT makes them durable. The write verifier changes when
// the gateway restarts, so that a client following RFC 1813 resends its
// uncommitted writes and loses nothing.
func TestWriteStability(t *testing.T) {
	cl := startCluster(t)
	if _, err := cl.c.Mkdir(context.Background(), 1, "scratch", 0o777, 0, 0); err != nil {
		t.Fatal(err)
	}
	g := cl.startGateway("/=rw,sync,clients=127.0.0.1", "/scratch=rw,async,clients=127.0.0.1")
	f := fs{t, g.dial(t, "", 1000, 1000)}
	root := mount(t, f.c, "/")
	if st, _ := f.mkdir(root, "x", 0o755); st != xdr.NFS3ERR_ACCES {
		t.Fatalf("mkdir as 1000 in root's directory: %v", st)
	}

	// sync: FILE_SYNC asked, FILE_SYNC answered; UNSTABLE asked, UNSTABLE
	// answered. (The file is in the directory /scratch exports too,
	// reached here through the sync export /: its handle names the
	// export.)
	st, scratchViaRoot := f.lookup(root, "scratch")
	want(t, "lookup scratch", st, xdr.NFS3_OK)
	st, syncFile := f.create(scratchViaRoot, "s", xdr.GUARDED, 0o644, 0)
	want(t, "create", st, xdr.NFS3_OK)
	st, w := f.write(syncFile, 0, []byte("sync data"), xdr.FILE_SYNC)
	want(t, "file_sync write on the sync export", st, xdr.NFS3_OK)
	if w.Committed != xdr.FILE_SYNC {
		t.Fatalf("sync export answered a FILE_SYNC write %v", w.Committed)
	}
	st, w = f.write(syncFile, 9, []byte("more"), xdr.UNSTABLE)
	want(t, "unstable write on the sync export", st, xdr.NFS3_OK)
	if w.Committed != xdr.UNSTABLE {
		t.Fatalf("sync export answered an UNSTABLE write %v", w.Committed)
	}
	if st, cv := f.commit(syncFile); st != xdr.NFS3_OK || cv != w.Verf {
		t.Fatalf("commit on the sync export: %v", st)
	}

	// async: UNSTABLE answered UNSTABLE, with the verifier COMMIT gives.
	scratch := mount(t, f.c, "/scratch")
	st, af := f.create(scratch, "a", xdr.GUARDED, 0o644, 0)
	want(t, "create on the async export", st, xdr.NFS3_OK)
	chunks := [][]byte{randomBytes(t, 1<<20), randomBytes(t, 1<<20), randomBytes(t, 4567)}
	var verf xdr.Writeverf3
	writeAll := func() {
		t.Helper()
		off := uint64(0)
		for _, p := range chunks {
			st, w := f.write(af, off, p, xdr.UNSTABLE)
			want(t, "unstable write on the async export", st, xdr.NFS3_OK)
			if w.Committed != xdr.UNSTABLE {
				t.Fatalf("async export answered an UNSTABLE write %v", w.Committed)
			}
			verf = w.Verf
			off += uint64(len(p))
		}
	}
	writeAll()
	if st, cv := f.commit(af); st != xdr.NFS3_OK || cv != verf {
		t.Fatalf("commit: %v, verifier %x, want the writes' %x", st, cv, verf)
	}

	// A restart between UNSTABLE writes and their COMMIT: the verifier
	// differs, the client resends and commits again.
	writeAll()
	before := verf
	g.stop()
	g2 := cl.startGateway("/=rw,sync,clients=127.0.0.1", "/scratch=rw,async,clients=127.0.0.1")
	f = fs{t, g2.dial(t, "", 1000, 1000)}
	st, cv := f.commit(af)
	want(t, "commit after the restart", st, xdr.NFS3_OK)
	if cv == before {
		t.Fatal("the write verifier did not change across a gateway restart")
	}
	writeAll()
	if st, cv := f.commit(af); st != xdr.NFS3_OK || cv != verf {
		t.Fatalf("commit of the resent writes: %v", st)
	}
	want(t, "the handle survives the restart", func() xdr.Nfsstat3 { st, _ := f.getattr(af); return st }(), xdr.NFS3_OK)

	// Another client of the cluster reads the bytes.
	other := cl.newClient()
	ctx := context.Background()
	d, err := other.Lookup(ctx, 1, "scratch")
	if err != nil {
		t.Fatal(err)
	}
	a, err := other.Lookup(ctx, d.Ino, "a")
	if err != nil {
		t.Fatal(err)
	}
	all := bytes.Join(chunks, nil)
	fl, err := other.Open(ctx, a.Ino, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Release(ctx)
	got := make([]byte, len(all)+10)
	n, _ := fl.ReadAt(ctx, got, 0)
	if n != len(all) || !bytes.Equal(got[:n], all) {
		t.Fatalf("after COMMIT another client reads %d bytes, not the %d written", n, len(all))
	}
}

// TestMalformedRecords: oversized, undecodable and truncated records close
// their connection (with a log line); the gateway goes on serving.
func TestMalformedRecords(t *testing.T) {
	cl := startCluster(t)
	g := cl.startGateway("/=rw,clients=127.0.0.1")
	frag := func(last bool, n uint32, body []byte) []byte {
		if last {
			n |= 1 << 31
		}
		return append(binary.BigEndian.AppendUint32(nil, n), body...)
	}
	garbage := bytes.Repeat([]byte{0xff}, 64)
	cases := map[string][]byte{
		"a 2 GiB fragment":            frag(true, 1<<31-1, nil),
		"fragments beyond the limit":  bytes.Repeat(frag(false, 1<<20, make([]byte, 1<<20)), 2),
		"an undecodable call header":  frag(true, uint32(len(garbage)), garbage),
		"a reply instead of a call":   frag(true, 12, []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0}),
		"an empty record":             frag(true, 0, nil),
		"endless empty fragments":     bytes.Repeat(frag(false, 0, nil), 2000),
		"a truncated fragment, EOF":   frag(true, 100, []byte{1, 2, 3}),
		"a call header cut in halves": append(frag(false, 4, []byte{0, 0, 0, 1}), frag(true, 4, []byte{0, 0, 0, 0})...),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", g.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			go c.Write(raw) // the server may close before reading it all
			if name == "a truncated fragment, EOF" {
				time.Sleep(10 * time.Millisecond)
				c.(*net.TCPConn).CloseWrite()
			}
			if n, err := io.Copy(io.Discard, c); (err != nil && !errors.Is(err, syscall.ECONNRESET)) || n != 0 {
				t.Fatalf("the connection answered %d bytes (%v), want it closed", n, err)
			}
		})
	}
	c := g.dial(t, "", 0, 0)
	if err := c.NFS(nfstest.ProcNull, nil, nil); err != nil {
		t.Fatalf("NULL after the malformed records: %v", err)
	}
}
