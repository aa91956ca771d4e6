package nfsha

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// LeaseFunc asks for, renews or releases the named lease (client.HALease).
type LeaseFunc func(ctx context.Context, name, holder string, ttl time.Duration, release bool) (rpc.HALeaseResp, error)

// Config configures a Controller.
type Config struct {
	// VIP is the pair's virtual address with its prefix length (IPv4),
	// Dev the device it goes on.
	VIP netip.Prefix
	Dev string
	// Name is the lease's name in the metadata service: the same on both
	// gateways of a pair, different for each pair. Default "nfs-ha/" and
	// the address.
	Name string
	// Holder names this process: its host name and a random suffix by
	// default (a restarted gateway never renews its former life's lease).
	Holder string
	// TTL is the lease's length (default 4 s); the active renews it every
	// TTL/4 and stops being active Margin (default 1 s) before its own
	// count of the lease runs out. Both gateways of a pair must use the
	// same TTL.
	TTL, Margin time.Duration
	// Lease is the metadata service's lease call.
	Lease LeaseFunc
	// OnActive runs on becoming active, after the address is up and
	// announced (NLM's grace period); OnStandby on ceasing to be, after
	// the address is gone.
	OnActive, OnStandby func()
	Log                 *slog.Logger
}

// Defaults of Config.
const (
	DefaultTTL    = 4 * time.Second
	DefaultMargin = time.Second
)

// Validate fills in the defaults and checks the rest (but Lease).
func (c *Config) Validate() error {
	var errs []error
	if !c.VIP.IsValid() || !c.VIP.Addr().Is4() {
		errs = append(errs, fmt.Errorf("the virtual address %v must be IPv4 ADDR/PREFIX", c.VIP))
	}
	if c.Dev == "" {
		errs = append(errs, errors.New("the device for the virtual address is required"))
	}
	if c.Name == "" && c.VIP.IsValid() {
		c.Name = "nfs-ha/" + c.VIP.Addr().String()
	}
	if c.Holder == "" {
		host, _ := os.Hostname()
		var r [6]byte
		_, _ = rand.Read(r[:])
		c.Holder = host + "/" + hex.EncodeToString(r[:])
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Margin == 0 {
		c.Margin = DefaultMargin
	}
	// The address's kernel lifetime is whole seconds and the kernel
	// removes it up to about a second late: a margin of at least 1 s keeps
	// that inside the lease, and a TTL of at least Margin + 2 s leaves the
	// active over a second of lease after each renewal's answer.
	if c.TTL < 3*time.Second || c.TTL > time.Minute {
		errs = append(errs, fmt.Errorf("lease TTL %v out of range [3s, 1m]", c.TTL))
	}
	if c.Margin < time.Second || c.Margin > c.TTL/3 {
		errs = append(errs, fmt.Errorf("lease margin %v out of range [1s, TTL/3]", c.Margin))
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return errors.Join(errs...)
}

// Controller runs one gateway's side of the pair (see the package doc).
type Controller struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	active bool
	conns  map[net.Conn]struct{} // accepted on the VIP while active

	stop chan struct{}
	done chan struct{}
}

// New checks cfg; Run starts the controller.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("nfs ha: %w", err)
	}
	if cfg.Lease == nil {
		return nil, errors.New("nfs ha: no lease call")
	}
	return &Controller{cfg: cfg, log: cfg.Log.With("vip", cfg.VIP.String(), "holder", cfg.Holder),
		conns: map[net.Conn]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Active reports whether this gateway is the pair's active one.
func (c *Controller) Active() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active
}

// Start removes an address a former life left on the device and starts
// the election loop (one goroutine until Stop).
func (c *Controller) Start() error {
	if err := removeVIP(c.cfg.VIP, c.cfg.Dev); err != nil {
		return fmt.Errorf("nfs ha: remove a stale virtual address: %w", err)
	}
	c.log.Info("nfs ha: standby", "lease", c.cfg.Name, "dev", c.cfg.Dev, "ttl", c.cfg.TTL)
	go c.run()
	return nil
}

// Stop ends the loop; an active gateway removes the address and then
// releases the lease, so that the standby takes over at once.
func (c *Controller) Stop() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// run is the election loop: as standby, ask for the lease every TTL/4;
// as active, renew it every TTL/4 (sooner after a failed renewal) and stop
// being active when its own count of the lease (from each renewal's send,
// less Margin) runs out.
func (c *Controller) run() {
	defer close(c.done)
	period := c.cfg.TTL / 4
	var validUntil time.Time // of the lease, as this side counts it; zero: standby
	var announce <-chan time.Time
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			if !validUntil.IsZero() {
				c.demote("stopping")
				ctx, cancel := context.WithTimeout(context.Background(), c.cfg.TTL)
				if _, err := c.cfg.Lease(ctx, c.cfg.Name, c.cfg.Holder, c.cfg.TTL, true); err != nil {
					c.log.Warn("nfs ha: lease release failed: the standby takes over when it runs out", "err", err)
				}
				cancel()
			}
			return
		case <-announce:
			announce = nil
			if !validUntil.IsZero() {
				c.arp()
			}
			continue
		case <-t.C:
		}
		if !validUntil.IsZero() && !time.Now().Before(validUntil) {
			c.demote("the lease ran out without a renewal")
			validUntil = time.Time{}
		}
		sent := time.Now()
		deadline := sent.Add(c.cfg.TTL)
		if !validUntil.IsZero() {
			deadline = validUntil
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		r, err := c.cfg.Lease(ctx, c.cfg.Name, c.cfg.Holder, c.cfg.TTL, false)
		cancel()
		next := period
		switch {
		case err == nil && r.Granted:
			until := sent.Add(c.cfg.TTL - c.cfg.Margin)
			if rem := time.Until(until); rem < time.Second {
				// too late to be worth it (a slow answer): as not granted
				c.log.Warn("nfs ha: lease answer too late to use", "left", rem)
				next = period / 2
				break
			}
			becoming := validUntil.IsZero()
			if becoming {
				// Accept connections to the address before it is up.
				c.setActive(true)
			}
			if err := setVIP(c.cfg.VIP, c.cfg.Dev, time.Until(until)); err != nil {
				c.log.Error("nfs ha: cannot set the virtual address", "err", err)
				c.demote("the address could not be set")
				validUntil = time.Time{}
				next = period / 2
				break
			}
			if becoming {
				c.log.Info("nfs ha: active: the virtual address is here", "dev", c.cfg.Dev, "epoch", r.Epoch)
				c.arp()
				announce = time.After(1100 * time.Millisecond)
				if c.cfg.OnActive != nil {
					c.cfg.OnActive()
				}
			}
			validUntil = until
		case err == nil:
			if !validUntil.IsZero() {
				c.demote("the service gave the lease to " + r.Holder)
				validUntil = time.Time{}
			}
			if r.RemainingMs > 0 {
				next = min(period, time.Duration(r.RemainingMs)*time.Millisecond+50*time.Millisecond)
			}
		default:
			c.log.Warn("nfs ha: lease call failed", "err", err, "active", !validUntil.IsZero())
			next = period / 2
		}
		if !validUntil.IsZero() {
			next = min(next, time.Until(validUntil))
		}
		t.Reset(max(next, 10*time.Millisecond))
	}
}

func (c *Controller) setActive(v bool) {
	c.mu.Lock()
	c.active = v
	c.mu.Unlock()
}

// demote removes the address and closes the connections that came to it.
func (c *Controller) demote(why string) {
	c.mu.Lock()
	c.active = false
	conns := c.conns
	c.conns = map[net.Conn]struct{}{}
	c.mu.Unlock()
	if err := removeVIP(c.cfg.VIP, c.cfg.Dev); err != nil {
		// Its lifetime removes it within a second of the lease's end.
		c.log.Error("nfs ha: cannot remove the virtual address", "err", err)
	}
	for conn := range conns {
		conn.Close()
	}
	c.log.Warn("nfs ha: standby: the virtual address is gone", "why", why, "connections_closed", len(conns))
	if c.cfg.OnStandby != nil {
		c.cfg.OnStandby()
	}
}

func (c *Controller) arp() {
	if err := gratuitousARP(c.cfg.Dev, c.cfg.VIP.Addr()); err != nil {
		c.log.Warn("nfs ha: gratuitous ARP failed", "err", err)
	}
}

// Listener wraps ln so that connections to the virtual address are only
// accepted while active, and are closed when this gateway stops being
// active (a client then reconnects to the new active). Connections to
// other addresses pass as they are.
func (c *Controller) Listener(ln net.Listener) net.Listener { return &vipListener{Listener: ln, c: c} }

type vipListener struct {
	net.Listener
	c *Controller
}

func (l *vipListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ta, ok := conn.LocalAddr().(*net.TCPAddr)
		if !ok || ta.AddrPort().Addr().Unmap() != l.c.cfg.VIP.Addr() {
			return conn, nil
		}
		l.c.mu.Lock()
		if !l.c.active {
			l.c.mu.Unlock()
			conn.Close()
			continue
		}
		vc := &vipConn{Conn: conn, c: l.c}
		l.c.conns[vc] = struct{}{}
		l.c.mu.Unlock()
		return vc, nil
	}
}

type vipConn struct {
	net.Conn
	c *Controller
}

func (v *vipConn) Close() error {
	v.c.mu.Lock()
	delete(v.c.conns, v)
	v.c.mu.Unlock()
	return v.Conn.Close()
}
