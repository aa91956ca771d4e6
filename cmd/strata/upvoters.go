package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/stratafs/strata/internal/meta"
)

// The metadata voters of `strata up --meta-voters N`: N voters of one group
// on loopback, on consecutive ports, voter 1 in DATA/meta (where a
// single-voter `strata up` keeps its metadata) and voter i in DATA/meta-i.

// voterDir is voter i's (0-based) data dir under the up data dir.
func voterDir(dataDir string, i int) string {
	if i == 0 {
		return filepath.Join(dataDir, "meta")
	}
	return filepath.Join(dataDir, fmt.Sprintf("meta-%d", i+1))
}

// voterAddrs returns the voters' addresses: those voter 1 was started with
// before (its meta.json), else n consecutive ports from listen's (port 0:
// the first n consecutive free ones).
func voterAddrs(dataDir, listen string, n int) ([]string, error) {
	var saved struct {
		Peers  []string `json:"peers"`
		NodeID string   `json:"node_id"`
	}
	if b, err := os.ReadFile(filepath.Join(voterDir(dataDir, 0), "meta.json")); err == nil {
		if err := json.Unmarshal(b, &saved); err != nil {
			return nil, fmt.Errorf("read %s: %w", filepath.Join(voterDir(dataDir, 0), "meta.json"), err)
		}
		switch {
		case len(saved.Peers) == n:
			return saved.Peers, nil
		case len(saved.Peers) == 0:
			return nil, fmt.Errorf("%s holds a single metadata voter (started without --meta-voters): it cannot become one of %d voters; start it with --meta-voters 1, or use a new --data", dataDir, n)
		default:
			return nil, fmt.Errorf("%s holds a group of %d metadata voters (%v), not %d: start it with --meta-voters %d", dataDir, len(saved.Peers), saved.Peers, n, len(saved.Peers))
		}
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--meta-listen %q: %w", listen, err)
	}
	base, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("--meta-listen %q: bad port", listen)
	}
	if base != 0 {
		var out []string
		for i := range n {
			out = append(out, net.JoinHostPort(host, strconv.Itoa(base+i)))
		}
		return out, nil
	}
	for range 50 { // find n consecutive free ports
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		p := ln.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{ln}
		out := []string{ln.Addr().String()}
		for i := 1; i < n; i++ {
			l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p+i)))
			if err != nil {
				break
			}
			lns = append(lns, l)
			out = append(out, l.Addr().String())
		}
		for _, l := range lns {
			l.Close()
		}
		if len(out) == n {
			return out, nil
		}
	}
	return nil, errors.New("no run of consecutive free ports for the metadata voters")
}

// startMetaVoters opens the n voters of mcfg's group and returns them
// once one of them leads. On error the voters opened are closed.
func startMetaVoters(mcfg meta.Config, dataDir string, n int) (svcs []*meta.Service, err error) {
	peers, err := voterAddrs(dataDir, mcfg.ListenAddr, n)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			for _, s := range svcs {
				s.Close()
			}
			svcs = nil
		}
	}()
	type opened struct {
		i   int
		s   *meta.Service
		err error
	}
	ch := make(chan opened, n)
	for i := range n {
		c := mcfg
		c.DataDir, c.ListenAddr, c.Peers = voterDir(dataDir, i), peers[i], peers
		go func() {
			s, err := meta.Open(c)
			ch <- opened{i, s, err}
		}()
	}
	svcs = make([]*meta.Service, n)
	var errs []error
	for range n {
		o := <-ch
		svcs[o.i] = o.s
		if o.err != nil {
			errs = append(errs, fmt.Errorf("metadata voter %s: %w", peers[o.i], o.err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		svcs = compact(svcs)
		return svcs, err
	}
	// Wait for the group to elect a leader (any voter: the stores and
	// the mount follow it over the voters' list).
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(svcs, (*meta.Service).Serving) {
		if time.Now().After(deadline) {
			return svcs, fmt.Errorf("metadata voters %v elected no leader within 30 s", peers)
		}
		time.Sleep(20 * time.Millisecond)
	}
	slog.Info("metadata voters up", "voters", peers)
	return svcs, nil
}

func compact(svcs []*meta.Service) []*meta.Service {
	var out []*meta.Service
	for _, s := range svcs {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}
