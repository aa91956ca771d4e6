package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// fsckTarget is what `strata fsck` found on one target.
type fsckTarget struct {
	ID           uint32 `json:"id"`
	Path         string `json:"path"`
	Addr         string `json:"address"`
	Checked      bool   `json:"checked"`
	Skipped      string `json:"skipped,omitempty"` // why it was not checked
	Chunks       uint64 `json:"chunks"`
	Orphans      uint64 `json:"orphans"`
	OrphanBytes  uint64 `json:"orphan_bytes"`
	Removed      uint64 `json:"removed"`
	orphanChunks []rpc.ChunkID
}

// fsckListPage is how many chunks a storage server lists per call.
const fsckListPage = 8192

// fsckRemoveBatch is how many orphans one SRemoveMany removes.
const fsckRemoveBatch = 1024

func init() {
	var af adminFlags
	var remove, asJSON, progress bool
	cmd := &cobra.Command{
		Use:   "fsck",
		Short: "Find chunk files that no file owns (and remove them with --remove-orphans)",
		Long: `Lists the chunk files of every target whose storage server is up and asks the metadata
service which of their inodes it knows. A chunk of an inode the namespace does not know is an
orphan: left by a metadata store restored from an older copy, or written by a mount after its
file was deleted (a mount cut off from the cluster past its session lease). Chunks of files
created while the check runs are never taken for orphans (only inode numbers handed out before
it started are judged). Targets whose server is down are listed as not checked. Nothing changes
without --remove-orphans.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			meta, key, err := af.resolve()
			if err != nil {
				return err
			}
			pw := progressWriter(cmd, progress)
			res, err := fsck(cmd.Context(), meta, key, remove, pw)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(res)
			}
			printFsck(os.Stdout, res, remove)
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&remove, "remove-orphans", false, "remove the orphan chunk files found")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&progress, "progress", false, "report progress on stderr: each target when done, and every few seconds while one is listed (default: when stderr is a terminal)")
	rootCmd.AddCommand(cmd)
}

// fsckProgressEvery is how often a target being listed is reported.
const fsckProgressEvery = 2 * time.Second

// fsckProgress reports a check under way to w (nil: nowhere).
type fsckProgress struct {
	w     io.Writer
	start time.Time
	last  time.Time
}

// listing reports r mid-listing, at most every fsckProgressEvery.
func (p *fsckProgress) listing(r *fsckTarget) {
	if p.w == nil || time.Since(p.last) < fsckProgressEvery {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "fsck: target %d (%s on %s): %d chunks listed, %d orphans so far (%s)\n",
		r.ID, r.Path, r.Addr, r.Chunks, r.Orphans, time.Since(p.start).Round(time.Second))
}

// done reports r's outcome.
func (p *fsckProgress) done(r *fsckTarget, i, n int) {
	if p.w == nil {
		return
	}
	p.last = time.Now()
	if !r.Checked {
		fmt.Fprintf(p.w, "fsck: target %d (%s on %s), %d of %d: not checked: %s\n", r.ID, r.Path, r.Addr, i, n, r.Skipped)
		return
	}
	fmt.Fprintf(p.w, "fsck: target %d (%s on %s), %d of %d: %d chunks, %d orphans, %d removed (%s)\n",
		r.ID, r.Path, r.Addr, i, n, r.Chunks, r.Orphans, r.Removed, time.Since(p.start).Round(time.Millisecond))
}

// progressWriter is where a command with a --progress flag (set to
// progress) reports it: stderr when asked, or by default when stderr is
// a terminal; nil for nowhere.
func progressWriter(cmd *cobra.Command, progress bool) io.Writer {
	if progress || (!cmd.Flags().Changed("progress") && isTerminal(os.Stderr)) {
		return os.Stderr
	}
	return nil
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// fsck checks every target of the cluster whose metadata service is at meta,
// reporting its progress to progress (nil: nowhere).
func fsck(ctx context.Context, meta string, key []byte, remove bool, progress io.Writer) ([]*fsckTarget, error) {
	mc, st, err := clusterStatus(ctx, meta, key)
	if err != nil {
		return nil, err
	}
	defer mc.Close()
	// Only numbers handed out before the listing are judged: a chunk of
	// an inode at or above next may belong to a file created since.
	var start rpc.InodesKnownResp
	if err := mc.Call(ctx, rpc.MInodesKnown, &rpc.InodesKnownReq{}, &start); err != nil {
		return nil, fmt.Errorf("inode numbers from %s: %w", meta, err)
	}
	stores := newStoreClients(key)
	defer stores.close()
	p := &fsckProgress{w: progress, start: time.Now()}
	var out []*fsckTarget
	for i, ti := range st.Targets {
		r := &fsckTarget{ID: ti.ID, Path: ti.Path, Addr: ti.Addr}
		out = append(out, r)
		if !ti.Alive {
			r.Skipped = "its storage server is down"
			p.done(r, i+1, len(st.Targets))
			continue
		}
		sc := stores.get(ti.Addr)
		if err := fsckTargetChunks(ctx, mc, sc, r, start.NextIno, p); err != nil {
			var se *storeError
			if !errors.As(err, &se) {
				return nil, err
			}
			// A server that died since the status: the others are
			// still worth checking.
			r.Skipped, r.Chunks, r.Orphans, r.OrphanBytes, r.orphanChunks = se.Error(), 0, 0, 0, nil
			p.done(r, i+1, len(st.Targets))
			continue
		}
		r.Checked = true
		if remove {
			if err := removeOrphans(ctx, sc, r); err != nil {
				return out, err
			}
		}
		p.done(r, i+1, len(st.Targets))
	}
	return out, nil
}

// fsckTargetChunks lists r's chunks page by page and counts those whose
// inode, below next, the namespace does not know.
func fsckTargetChunks(ctx context.Context, mc transport.Caller, sc *transport.Client, r *fsckTarget, next uint64, p *fsckProgress) error {
	for from := uint32(0); ; {
		var page rpc.ListChunksResp
		if err := sc.Call(ctx, rpc.SListChunks, &rpc.ListChunksReq{Target: r.ID, From: from, Max: fsckListPage}, &page); err != nil {
			return &storeError{fmt.Errorf("listing its chunks failed: %w", err)}
		}
		if len(page.Bytes) != len(page.Inos) {
			return fmt.Errorf("target %d (%s on %s) listed %d chunks but %d sizes", r.ID, r.Path, r.Addr, len(page.Inos), len(page.Bytes))
		}
		for lo := 0; lo < len(page.Inos); lo += rpc.MaxInodesKnown {
			inos := page.Inos[lo:min(lo+rpc.MaxInodesKnown, len(page.Inos))]
			var known rpc.InodesKnownResp
			if err := mc.Call(ctx, rpc.MInodesKnown, &rpc.InodesKnownReq{Inos: inos}, &known); err != nil {
				return fmt.Errorf("ask the metadata service about the chunks of target %d: %w", r.ID, err)
			}
			if len(known.Known) != len(inos) {
				return fmt.Errorf("metadata service answered %d of %d inode numbers", len(known.Known), len(inos))
			}
			for i, ino := range inos {
				r.Chunks++
				if known.Known[i] || ino >= next {
					continue
				}
				r.Orphans++
				r.OrphanBytes += page.Bytes[lo+i]
				r.orphanChunks = append(r.orphanChunks, rpc.ChunkID{Target: r.ID, Ino: ino})
			}
			p.listing(r)
		}
		if page.Done {
			return nil
		}
		if page.Next <= from {
			return fmt.Errorf("target %d (%s on %s): chunk listing does not advance past directory %d", r.ID, r.Path, r.Addr, from)
		}
		from = page.Next
	}
}

// clusterStatus asks the metadata service at meta for the cluster's
// status, and answers its client (for the caller to close) with it.
func clusterStatus(ctx context.Context, meta string, key []byte) (*transport.Multi, *rpc.ClusterStatusResp, error) {
	mc := adminMetaClient(meta, key)
	var st rpc.ClusterStatusResp
	if err := mc.Call(ctx, rpc.MClusterStatus, &rpc.Empty{}, &st); err != nil {
		mc.Close()
		return nil, nil, fmt.Errorf("cluster status from %s: %w", meta, err)
	}
	return mc, &st, nil
}

// storeClients are the admin commands' clients of storage servers, one
// per address, made on first use.
type storeClients struct {
	key []byte
	m   map[string]*transport.Client
}

func newStoreClients(key []byte) *storeClients {
	return &storeClients{key: key, m: map[string]*transport.Client{}}
}

func (s *storeClients) get(addr string) *transport.Client {
	c := s.m[addr]
	if c == nil {
		c = adminClient(addr, s.key)
		s.m[addr] = c
	}
	return c
}

func (s *storeClients) close() {
	for _, c := range s.m {
		c.Close()
	}
}

// storeError is a failure of a storage server's call, which leaves its
// target unchecked.
type storeError struct{ error }

func (e *storeError) Unwrap() error { return e.error }

func removeOrphans(ctx context.Context, sc *transport.Client, r *fsckTarget) error {
	for lo := 0; lo < len(r.orphanChunks); lo += fsckRemoveBatch {
		batch := r.orphanChunks[lo:min(lo+fsckRemoveBatch, len(r.orphanChunks))]
		if err := sc.Call(ctx, rpc.SRemoveMany, &rpc.ChunksReq{Chunks: batch}, &rpc.Empty{}); err != nil {
			return fmt.Errorf("remove orphan chunks of target %d (%s on %s): %w", r.ID, r.Path, r.Addr, err)
		}
		r.Removed += uint64(len(batch))
	}
	return nil
}

func printFsck(out io.Writer, res []*fsckTarget, removed bool) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TARGET\tPATH\tSERVER\tCHUNKS\tORPHANS\tORPHAN BYTES\tREMOVED")
	var orphans, gone uint64
	unchecked := 0
	for _, r := range res {
		if !r.Checked {
			unchecked++
			fmt.Fprintf(w, "%d\t%s\t%s\tnot checked: %s\t\t\t\n", r.ID, r.Path, r.Addr, r.Skipped)
			continue
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%d\t%s\t%d\n", r.ID, r.Path, r.Addr, r.Chunks, r.Orphans, humanBytes(r.OrphanBytes), r.Removed)
		orphans += r.Orphans
		gone += r.Removed
	}
	w.Flush()
	switch {
	case orphans == 0:
		fmt.Fprintln(out, "no orphan chunks")
	case removed:
		fmt.Fprintf(out, "%d orphan chunks found, %d removed\n", orphans, gone)
	default:
		fmt.Fprintf(out, "%d orphan chunks found; run again with --remove-orphans to remove them\n", orphans)
	}
	if unchecked > 0 {
		fmt.Fprintf(out, "%d targets not checked\n", unchecked)
	}
}
