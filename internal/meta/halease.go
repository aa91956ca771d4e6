package meta

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// Named leases (MHALease): the election of an NFS gateway HA pair
// (docs/design/0015 § HA pair). A lease is a record in the replicated state
// (schema.HALease): who holds it and until when, in the leader's time
// stamps. Every grant, renewal and release is a raft entry, so a grant is
// only ever made by a leader whose entry commits, and both gateways of a
// pair see one holder even when they cannot see each other.
//
// The holder counts its lease from before it sent the request; the
// service counts it from its stamp, taken later, so the holder's view
// ends first. A change of holder is refused — besides while the stamped
// expiry is ahead — until the lease's TTL has passed on this leader's own
// clock since it took office and since it last granted that lease: a
// leader whose wall clock differs from its predecessor's (or jumps) never
// frees a lease early.

// haLeaseFlagRelease marks a release in command.Flags (opHALease).
const haLeaseFlagRelease = 1

// haLeaseMaxTTL bounds a lease's TTL.
const haLeaseMaxTTL = 10 * time.Minute

// haLeases is the leader's memory of its own grants (see above).
type haLeases struct {
	mu      sync.Mutex // serialises check-then-propose of every lease request
	granted map[string]time.Time
}

func (s *Service) registerHALease() {
	handle(s, rpc.MHALease, func(_ context.Context, r *rpc.HALeaseReq) (rpc.Message, error) {
		return s.haLease(r)
	})
}

func (s *Service) haLease(r *rpc.HALeaseReq) (rpc.Message, error) {
	ttl := time.Duration(r.TTLMs) * time.Millisecond
	switch {
	case r.Name == "" || len(r.Name) > rpc.MaxHALeaseName || r.Holder == "" || len(r.Holder) > rpc.MaxHALeaseName:
		return nil, rpc.Errorf(syscall.EINVAL, "lease name and holder must be 1 to %d bytes", rpc.MaxHALeaseName)
	case !r.Release && (ttl < 100*time.Millisecond || ttl > haLeaseMaxTTL):
		return nil, rpc.Errorf(syscall.EINVAL, "lease TTL %v out of range [100ms, %v]", ttl, haLeaseMaxTTL)
	}
	hl := &s.haLeases
	hl.mu.Lock()
	defer hl.mu.Unlock()
	cur, err := readHALease(s.db, r.Name)
	if err != nil {
		return nil, rpc.Errorf(syscall.EIO, "read lease %q: %v", r.Name, err)
	}
	now := s.cfg.Clock.Now()
	if !r.Release && cur.Holder != r.Holder && cur.Holder != "" {
		// A change of holder: also wait out the TTL on this leader's clock.
		wait := ttl - now.Sub(time.Unix(0, s.leaderSince.Load()))
		if at, ok := hl.granted[r.Name]; ok {
			wait = max(wait, ttl-now.Sub(at))
		}
		if rem := time.Duration(cur.Expiry - now.UnixNano()); rem > wait {
			wait = rem
		}
		if wait > 0 {
			return &rpc.HALeaseResp{Holder: cur.Holder, RemainingMs: msOf(wait), Epoch: cur.Epoch}, nil
		}
	}
	c := &command{Op: opHALease, Now: now.UnixNano(), Name: r.Name, Host: r.Holder, LeaseMs: r.TTLMs}
	if r.Release {
		c.Flags = haLeaseFlagRelease
	}
	res, err := s.propose(c)
	if err != nil {
		return nil, err
	}
	if err := res.err(); err != nil {
		return nil, err
	}
	resp, ok := res.reply().(*rpc.HALeaseResp)
	if !ok {
		return nil, rpc.Errorf(syscall.EIO, "lease change answered %T", res.reply())
	}
	if resp.Granted {
		if hl.granted == nil {
			hl.granted = map[string]time.Time{}
		}
		hl.granted[r.Name] = now
		if cur.Holder != r.Holder || cur.Expiry <= now.UnixNano() {
			s.log.Info("lease granted", "lease", r.Name, "holder", r.Holder, "epoch", resp.Epoch, "ttl", ttl, "previous", cur.Holder)
		}
	} else if r.Release && cur.Holder == r.Holder {
		delete(hl.granted, r.Name)
		s.log.Info("lease released", "lease", r.Name, "holder", r.Holder)
	}
	return resp, nil
}

func msOf(d time.Duration) uint32 {
	return uint32(min(max(d.Milliseconds(), 0), math.MaxUint32))
}

// readHALease reads the lease name (the zero lease when there is none).
func readHALease(r kv.Reader, name string) (schema.HALease, error) {
	v, err := r.Get(schema.HALeaseKey(name))
	if errors.Is(err, kv.ErrNotFound) {
		return schema.HALease{}, nil
	}
	if err != nil {
		return schema.HALease{}, err
	}
	return schema.DecodeHALease(v)
}

// haLease applies opHALease: Name the lease, Host the asker, LeaseMs its
// TTL, Flags haLeaseFlagRelease. The asker gets the lease when it holds it
// or it is free (never held, released or past its expiry); a release by
// its holder ends it now. The answer is the lease afterwards.
func (x *opCtx) haLease(c *command) (*answer, error) {
	l, err := readHALease(x.b, c.Name)
	if err != nil {
		return nil, fmt.Errorf("read lease %q: %w", c.Name, err)
	}
	live := l.Holder != "" && l.Expiry > x.now
	granted := false
	switch {
	case c.Flags&haLeaseFlagRelease != 0:
		if l.Holder == c.Host && live {
			l.Expiry = x.now
			live = false
		}
	case l.Holder == c.Host || !live:
		if l.Holder != c.Host {
			l.Epoch++
			l.Holder = c.Host
		}
		l.Expiry = x.now + int64(c.LeaseMs)*int64(time.Millisecond)
		live, granted = true, true
	}
	if err := x.b.Set(schema.HALeaseKey(c.Name), schema.AppendHALease(nil, &l)); err != nil {
		return nil, err
	}
	resp := &rpc.HALeaseResp{Granted: granted, Holder: l.Holder, Epoch: l.Epoch}
	if live {
		resp.RemainingMs = msOf(time.Duration(l.Expiry - x.now))
	} else {
		resp.Holder = ""
	}
	return &answer{msg: resp}, nil
}
