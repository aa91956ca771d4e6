package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/rpc"
)

// The fence probe: the mount follows the group map, so once a group has a
// new primary it hardly ever asks the deposed one anything, and the load
// cannot tell whether that one would still acknowledge writes (split
// brain). For the faults that depose a primary that keeps running
// (stop-primary, partition-primary, heartbeat-loss-primary), the probe
// asks it directly, on a
// connection of its own from the client host made before the fault: once
// status names the new primary, it sends writes of a chunk of the group in
// the epoch before the fault — while the fault lasts, one queued just
// before it is undone (a resumed SIGSTOP'ed server reads it first, before
// any heartbeat could renew its lease), and for 2 s after. Any refusal
// (ESTALE, EAGAIN) is correct, as is no answer; an acknowledgement is
// split brain. The write carries the bytes the chunk already holds (a
// pre-written file of the readers, found through its layout), so even an
// acknowledged one changes no data.

// Fence counts what a deposed primary answered the probe's writes.
type Fence struct {
	Asked    int `json:"asked"`
	Refused  int `json:"refused"`
	NoAnswer int `json:"no_answer"`
	// FirstRefusal: the first refusal's error, to show which it was.
	FirstRefusal string `json:"first_refusal,omitempty"`
	// Accepted: writes the deposed primary acknowledged (split brain).
	Accepted []string `json:"accepted"`
}

// fenceProbe is the prepared write of one trial.
type fenceProbe struct {
	p      *prober
	victim string
	req    rpc.WriteReq
	r      *Fence
	undone time.Time // when run undid the fault
}

// prepareFence finds a chunk of group g (slot i of a readers' file whose
// layout names g, chunk offset 0: file offset i × stripe size) and
// dials victim with a read of it in epoch.
func (p *prober) prepareFence(l *Load, victim string, g uint32, epoch uint64) (*fenceProbe, error) {
	if len(l.readers) == 0 {
		return nil, errors.New("fence probe: the load has no readers' files")
	}
	for k := range l.cfg.ReadFiles {
		path := l.readPath(k)
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(path, layout.XattrName, buf)
		if err != nil {
			return nil, fmt.Errorf("fence probe: layout of %s: %w", path, err)
		}
		var lx layout.Xattr
		if err := json.Unmarshal(buf[:n], &lx); err != nil {
			return nil, fmt.Errorf("fence probe: layout of %s: %w", path, err)
		}
		for i, tg := range lx.Targets {
			off := int64(i) * int64(lx.StripeSize)
			if tg != rpc.GroupBit|g || off+4096 > l.cfg.ReadFileBytes {
				continue
			}
			st, err := os.Stat(path)
			if err != nil {
				return nil, fmt.Errorf("fence probe: %w", err)
			}
			data := make([]byte, 4096)
			pattern(data, k, off)
			fp := &fenceProbe{p: p, victim: victim, r: &Fence{Accepted: []string{}},
				req: rpc.WriteReq{Chunk: rpc.ChunkID{Target: tg, Ino: st.Sys().(*syscall.Stat_t).Ino, Epoch: epoch}, Data: data}}
			// The connection, made before the fault.
			var resp rpc.ReadResp
			err = p.call(victim, rpc.SRead, &rpc.ReadReq{Chunk: fp.req.Chunk, Len: 4096}, &resp, 2*time.Second)
			if err != nil {
				return nil, fmt.Errorf("fence probe: read of group %d's chunk of %s from its primary %s: %w", g, path, victim, err)
			}
			return fp, nil
		}
	}
	return nil, fmt.Errorf("fence probe: no readers' file has a stripe on group %d", g)
}

// ask sends the write once, bounded by d, and counts the answer.
func (f *fenceProbe) ask(d time.Duration, now time.Duration, newEpoch uint64) {
	var resp rpc.WriteResp
	req := f.req
	err := f.p.call(f.victim, rpc.SWrite, &req, &resp, d)
	f.record(err, now, newEpoch)
}

func (f *fenceProbe) record(err error, now time.Duration, newEpoch uint64) {
	f.r.Asked++
	var re *rpc.Error
	switch {
	case err == nil:
		f.r.Accepted = append(f.r.Accepted, fmt.Sprintf("%.1fs: deposed primary %s acknowledged a write of group %d in epoch %d after the group moved to epoch %d",
			now.Seconds(), f.victim, f.req.Chunk.Target&^rpc.GroupBit, f.req.Chunk.Epoch, newEpoch))
	case errors.As(err, &re):
		f.r.Refused++
		if f.r.FirstRefusal == "" {
			f.r.FirstRefusal = err.Error()
		}
	default:
		f.r.NoAnswer++
	}
}

// run probes from the switch until the hold ends, queues one write, runs
// undo, and probes 2 s more.
func (f *fenceProbe) run(until time.Time, now func() time.Duration, newEpoch uint64, undo func() error) error {
	for time.Now().Before(until) {
		f.ask(500*time.Millisecond, now(), newEpoch)
		time.Sleep(200 * time.Millisecond)
	}
	queued := make(chan error, 1)
	go func() {
		var resp rpc.WriteResp
		req := f.req
		queued <- f.p.call(f.victim, rpc.SWrite, &req, &resp, 5*time.Second)
	}()
	time.Sleep(50 * time.Millisecond) // let it be sent
	if err := undo(); err != nil {
		return err
	}
	f.undone = time.Now()
	f.record(<-queued, now(), newEpoch)
	for after := time.Now(); time.Since(after) < 2*time.Second; {
		f.ask(500*time.Millisecond, now(), newEpoch)
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// call sends one request to addr alone from the client host, within d.
func (p *prober) call(addr string, m rpc.Method, req, resp rpc.Message, d time.Duration) error {
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return p.client(addr).Call(ctx, m, req, resp)
	}
	if h := p.c.clientHost(); h != nil {
		var err error
		if derr := h.Do(func() error { err = call(); return nil }); derr != nil {
			return derr
		}
		return err
	}
	return call()
}
