package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/failpoint"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// Registration state machine (one goroutine, registrationLoop):
//
//	state         event                          next
//	unregistered  MRegisterServer ok             registered (ids installed)
//	unregistered  error (service down, …)        unregistered, after backoff
//	registered    heartbeat (at once, then every
//	              interval), answer ok           registered (group map and
//	                                             lease installed)
//	registered    heartbeat answers ESTALE       unregistered, at once
//	registered    heartbeat fails otherwise      registered (next tick retries)
//	any           Close                          stopped
//
// Backoff doubles from 100 ms to 5 s, with jitter. While unregistered the
// server keeps serving the targets whose ids it already knows. Calls go to
// the leader among the metadata voters (transport.Multi): within a call's
// time a leader change is followed, not a failure; a new leader that does
// not know this server answers ESTALE, and it registers again there.
const (
	backoffMin  = 100 * time.Millisecond
	backoffMax  = 5 * time.Second
	callTimeout = 5 * time.Second
	// attemptTimeout bounds a call's attempt at one voter while there are
	// others to try (transport.MultiConfig.AttemptTimeout): a leader that
	// hangs costs this long before the call goes to another voter.
	attemptTimeout = 2 * time.Second
)

func (s *Server) registrationLoop() {
	defer s.wg.Done()
	cl := s.meta // closed by close
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	backoff := backoffMin
	failures := 0
	for {
		err := s.registerOnce(ctx, cl)
		s.regErr.Store(&err)
		if err == nil {
			backoff = backoffMin
			failures = 0
			s.heartbeatUntilStale(ctx, cl)
		} else {
			failures++
			// Log the first failure and then every tenth, not every retry.
			if failures == 1 || failures%10 == 0 {
				s.log.Warn("cannot register with metadata service; retrying", "meta", s.cfg.MetaAddr, "attempts", failures, "err", err)
			}
		}
		select {
		case <-s.stop:
			return
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		if err != nil {
			backoff = min(2*backoff, backoffMax)
		}
	}
}

// registerOnce sends MRegisterServer and installs the answered ids.
func (s *Server) registerOnce(ctx context.Context, cl *transport.Multi) error {
	req := &rpc.RegisterServerReq{Addr: s.addr, Domain: s.cfg.Domain}
	req.Host, _ = os.Hostname()
	for _, t := range s.targets {
		_ = t.statfs()
		req.Targets = append(req.Targets, rpc.TargetReg{
			UUID: t.uuid, Path: absPath(t.path), TotalBytes: t.totalBytes.Load(), FreeBytes: t.availBytes(),
			FSID: t.fsid.Load(), RawFree: t.rawFree.Load(), PrevID: t.id.Load(),
			InoCeiling: t.inoHigh.Load(),
		})
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var resp rpc.RegisterServerResp
	if err := cl.Call(cctx, rpc.MRegisterServer, req, &resp); err != nil {
		return err
	}
	if len(resp.TargetIDs) != len(s.targets) {
		return errors.New("metadata service answered a wrong number of target ids")
	}
	ids := map[uint32]*target{}
	for i, t := range s.targets {
		id := resp.TargetIDs[i]
		if id == 0 {
			return errors.New("metadata service answered target id 0")
		}
		if _, dup := ids[id]; dup {
			return errors.New("metadata service answered one target id twice")
		}
		ids[id] = t
	}
	for i, t := range s.targets {
		id := resp.TargetIDs[i]
		if old := t.id.Swap(id); old != id {
			if old != 0 {
				s.log.Warn("metadata service assigned a new target id", "target", t.path, "old", old, "new", id)
			}
			s.rememberID(t, id)
		}
	}
	s.byID.Store(&ids)
	s.serverID.Store(resp.ServerID)
	s.regOnce.Do(func() { close(s.registered) })
	s.log.Info("registered with metadata service", "meta", s.cfg.MetaAddr, "server", resp.ServerID, "targets", resp.TargetIDs)
	return nil
}

// rememberID stores the assigned id in the target's identity file so that
// a restart serves the target before it has registered again.
func (s *Server) rememberID(t *target, id uint32) {
	if err := t.updateIdentity(func(i *identity) { i.ID = id }); err != nil {
		s.log.Warn("cannot record target id in identity file", "target", t.path, "err", err)
	}
}

// heartbeatUntilStale heartbeats every interval until the service answers
// ESTALE (forgot us: register again) or the server closes.
func (s *Server) heartbeatUntilStale(ctx context.Context, cl *transport.Multi) {
	interval := s.cfg.HeartbeatInterval
	tick := time.NewTicker(interval)
	defer tick.Stop()
	failing := false
	// The first heartbeat goes at once: its answer brings the mirror
	// group map and the primary lease, without which a restarted store
	// serves no group.
	for first := true; ; first = false {
		if !first {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
		req := &rpc.ServerHeartbeatReq{ServerID: s.serverID.Load()}
		now := time.Now()
		for _, t := range s.targets {
			req.Unsynced = append(req.Unsynced, t.unsyncedFigures(now))
			_ = t.statfs()
			req.Targets = append(req.Targets, rpc.TargetUsage{ID: t.id.Load(), TotalBytes: t.totalBytes.Load(), FreeBytes: t.availBytes()})
			req.FSIDs = append(req.FSIDs, t.fsid.Load())
			req.RawFree = append(req.RawFree, t.rawFree.Load())
			req.InoCeiling = max(req.InoCeiling, t.inoHigh.Load())
		}
		cctx, cancel := context.WithTimeout(ctx, max(s.cfg.HeartbeatInterval, time.Second))
		// The lease runs from the send: the service counts from the
		// receipt, which is later (mirror.go).
		sent := time.Now()
		var resp rpc.ServerHeartbeatResp
		// The fault harness's "heartbeat loss alone": this heartbeat is
		// not sent, everything else still reaches the service.
		err := failpoint.Eval("store/before-heartbeat")
		if err == nil {
			err = cl.Call(cctx, rpc.MServerHeartbeat, req, &resp)
		}
		cancel()
		switch {
		case err == nil:
			// Tests hold an answer here, to have it arrive after a newer
			// map (docs/design/0014 § Group map versions).
			failpoint.Hit("store/before-heartbeat-install")
			s.installHeartbeat(&resp, sent)
			// A server with mirror groups heartbeats at least every
			// third of its primary lease, so that one late answer does
			// not lapse the lease (and stall its groups' writes).
			if every := heartbeatEvery(s.cfg.HeartbeatInterval, resp.LeaseMs); every != interval {
				interval = every
				tick.Reset(interval)
			}
			if failing {
				s.log.Info("heartbeats to metadata service resumed", "meta", s.cfg.MetaAddr)
			}
			failing = false
		case errors.Is(err, syscall.ESTALE):
			s.log.Warn("metadata service does not know this server; registering again", "meta", s.cfg.MetaAddr, "server", req.ServerID)
			return
		default:
			if !failing {
				s.log.Warn("heartbeat to metadata service failed", "meta", s.cfg.MetaAddr, "err", err)
			}
			failing = true
		}
	}
}

// heartbeatEvery is the heartbeat period of a server configured for
// interval whose metadata service grants a primary lease of leaseMs (0:
// none, the server has no mirror groups): a third of the lease when that
// is shorter, but not under 100 ms.
func heartbeatEvery(interval time.Duration, leaseMs uint32) time.Duration {
	if leaseMs == 0 {
		return interval
	}
	return min(interval, max(time.Duration(leaseMs)*time.Millisecond/3, 100*time.Millisecond))
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
