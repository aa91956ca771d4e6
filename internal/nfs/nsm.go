package nfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/stratafs/strata/internal/nfs/xdr"
)

// The status monitor's side of a restart: as rpc.statd and sm-notify do,
// the gateway keeps, on stable storage, the client hosts that took locks
// (monitorFile in Config.NLMStateDir), and at its next start tells each
// one's status monitor that it restarted (SM_NOTIFY), so that their lock
// managers reclaim their locks within the grace period. Without a state
// directory there is no list and nobody is told.

// monitorFile is the list's file: one host a line, "name callerAddr
// localAddr" (the address the host called from, and the gateway's address
// it called: the notification comes from that one, which the host knows).
const monitorFile = "nlm-hosts"

// maxMonitored bounds the list.
const maxMonitored = 4096

// notifyTries bounds the SM_NOTIFY attempts per host (1, 2, 4, 8 s apart).
const notifyTries = 5

const smProcNotify = 6

// monitored is a client host in the list.
type monitored struct {
	name          string
	remote, local netip.Addr
}

// loadMonitored reads the list (none: empty).
func loadMonitored(dir string) (map[string]monitored, error) {
	out := map[string]monitored{}
	b, err := os.ReadFile(filepath.Join(dir, monitorFile))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nlm: monitored hosts: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() && len(out) < maxMonitored {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			continue
		}
		r, err1 := netip.ParseAddr(f[1])
		l, err2 := netip.ParseAddr(f[2])
		if err1 != nil || err2 != nil {
			continue
		}
		out[f[0]] = monitored{name: f[0], remote: r, local: l}
	}
	return out, nil
}

// saveMonitored writes the list: a new file, synced, renamed over the old
// one, the directory synced.
func saveMonitored(dir string, hosts map[string]monitored) error {
	names := make([]string, 0, len(hosts))
	for n := range hosts {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	for _, n := range names {
		h := hosts[n]
		fmt.Fprintf(&b, "%s %s %s\n", h.name, h.remote, h.local)
	}
	tmp := filepath.Join(dir, monitorFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("nlm: monitored hosts: %w", err)
	}
	_, err = f.Write(b.Bytes())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, monitorFile))
	}
	if err == nil {
		var d *os.File
		if d, err = os.Open(dir); err == nil {
			err = d.Sync()
			d.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("nlm: saving monitored hosts: %w", err)
	}
	return nil
}

// validHostName: a caller_name the list can keep (one field of a line).
func validHostName(name string) bool {
	return name != "" && !strings.ContainsAny(name, " \t\r\n")
}

// monitor records host before its lock is granted (as a server's lockd
// asks its statd to monitor a client before granting): the list must hold
// every host that may hold a lock when the gateway dies. False when it
// cannot be recorded (the lock is then refused: NLM4_DENIED_NOLOCKS).
func (n *nlm) monitor(host string, remote, local netip.Addr) bool {
	if n.stateDir == "" {
		return true
	}
	m := monitored{name: host, remote: remote.Unmap(), local: local.Unmap()}
	n.monMu.Lock()
	defer n.monMu.Unlock()
	if n.monitored[host] == m {
		// Listed; if only to be told of this start, it now stays.
		delete(n.pending, host)
		return true
	}
	delete(n.pending, host)
	if !validHostName(host) || (n.monitored[host] == monitored{} && len(n.monitored) >= maxMonitored) {
		n.log.Warn("nlm: cannot monitor this client host; refusing its lock", "host", host, "monitored", len(n.monitored))
		return false
	}
	old, had := n.monitored[host]
	n.monitored[host] = m
	if err := saveMonitored(n.stateDir, n.monitored); err != nil {
		if had {
			n.monitored[host] = old
		} else {
			delete(n.monitored, host)
		}
		n.log.Error("nlm: refusing a lock: the monitored host list cannot be saved", "host", host, "err", err)
		return false
	}
	return true
}

// unmonitor drops host from the list (it restarted and holds nothing).
func (n *nlm) unmonitor(host string) {
	if n.stateDir == "" {
		return
	}
	n.monMu.Lock()
	defer n.monMu.Unlock()
	if _, ok := n.monitored[host]; !ok {
		return
	}
	delete(n.monitored, host)
	delete(n.pending, host)
	if err := saveMonitored(n.stateDir, n.monitored); err != nil {
		n.log.Warn("nlm: saving the monitored host list", "err", err)
	}
}

// notifyAll tells every host of the list loaded at start that the gateway
// restarted, each on its own goroutine; a host told is dropped from the
// list unless it locked (reclaimed) since the start.
func (n *nlm) notifyAll(hosts map[string]monitored) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ctx.Err() != nil {
		return // closed before serving
	}
	for _, h := range hosts {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.notify(h); err != nil {
				n.log.Warn("nsm: could not tell a client host that the gateway restarted; its locks are not reclaimed",
					"host", h.name, "addr", h.remote, "err", err)
				return
			}
			n.log.Info("nsm: told a client host that the gateway restarted", "host", h.name, "addr", h.remote)
			n.monMu.Lock()
			if n.pending[h.name] {
				// Not locked since the start (a reclaim keeps it).
				delete(n.pending, h.name)
				delete(n.monitored, h.name)
				if err := saveMonitored(n.stateDir, n.monitored); err != nil {
					n.log.Warn("nlm: saving the monitored host list", "err", err)
				}
			}
			n.monMu.Unlock()
		}()
	}
}

// notify sends SM_NOTIFY to h's status monitor (its port from h's port
// mapper), from the address h knew the gateway by when there is one.
func (n *nlm) notify(h monitored) error {
	pause := time.Second
	var err error
	for try := 0; try < notifyTries; try++ {
		if try > 0 {
			select {
			case <-time.After(pause):
				pause *= 2
			case <-n.ctx.Done():
				return n.ctx.Err()
			}
		}
		if err = n.notifyOnce(h, h.local); err == nil {
			return nil
		}
		if err = n.notifyOnce(h, netip.Addr{}); err == nil {
			return nil
		}
	}
	return err
}

func (n *nlm) notifyOnce(h monitored, local netip.Addr) error {
	c, err := n.dialService(local, h.remote, nsmProgram, nsmVersion)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(nsmProgram, nsmVersion, smProcNotify, &xdr.Stat_chge{Mon_name: n.name, State: n.state}, nil)
}
