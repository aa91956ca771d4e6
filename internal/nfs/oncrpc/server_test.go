package oncrpc

import (
	"bytes"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// The SUCCESS reply header copied from its template is the generated
// encoder's, for any xid, and decodes back to that xid.
func TestAcceptedTemplate(t *testing.T) {
	for _, xid := range []uint32{0, 1, 0x7fffffff, 0xdeadbeef, ^uint32(0)} {
		var got, want bytes.Buffer
		got.WriteString("prefix")
		writeAccepted(&got, xid, xdr.SUCCESS, nil)
		want.WriteString("prefix")
		writeAcceptedXDR(&want, xid, xdr.SUCCESS, nil)
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("xid %#x: template %x, encoder %x", xid, got.Bytes(), want.Bytes())
		}
		var m xdr.Rpc_msg
		rest, err := xdr.Decode(got.Bytes()[len("prefix"):], &m)
		if err != nil || len(rest) != 0 || m.Xid != xid || m.Body.Mtype != xdr.REPLY {
			t.Fatalf("xid %#x: decoded %+v, rest %d, err %v", xid, m, len(rest), err)
		}
		if ar := m.Body.Rbody().Areply(); ar.Reply_data.Stat != xdr.SUCCESS {
			t.Fatalf("xid %#x: stat %v", xid, ar.Reply_data.Stat)
		}
	}
}

// Workers run every call handed to them, all at once when the calls wait
// for each other (a worker busy with one call never holds up another),
// serve later calls on the same goroutines, and exit when the server
// closes.
func TestWorkers(t *testing.T) {
	base := runtime.NumGoroutine()
	done := make(chan struct{})
	w := newWorkers(done)
	const n = 32
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		var arrived atomic.Int32
		release := make(chan struct{})
		wg.Add(n)
		for i := 0; i < n; i++ {
			w.run(func() {
				defer wg.Done()
				if arrived.Add(1) == n {
					close(release) // the last of the round frees them all
				}
				select {
				case <-release:
				case <-time.After(10 * time.Second):
					t.Error("a call waited 10 s for the others: calls do not run at once")
				}
			})
		}
		wg.Wait()
		// The round's workers wait for calls; the next round reuses them.
		if g := runtime.NumGoroutine() - base; g > n+2 {
			t.Fatalf("round %d: %d goroutines beyond the test's, want at most %d workers", round, g, n)
		}
	}
	close(done)
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > base; {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left 10 s after close, %d before the workers", runtime.NumGoroutine(), base)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
