package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// scrubTarget is what `strata scrub` found on one target (with its group's
// other copy, for a group's primary).
type scrubTarget struct {
	ID       uint32 `json:"id"`
	Group    uint32 `json:"group,omitempty"` // 0: in no group (verified alone)
	Path     string `json:"path"`
	Addr     string `json:"address"`
	Scrubbed bool   `json:"scrubbed"`
	Skipped  string `json:"skipped,omitempty"` // why it was not (fully) scrubbed
	scrubCounts
	Problems []string `json:"problems,omitempty"`
}

// scrubCounts are the figures of SScrub answers (rpc.ScrubResp), summed.
type scrubCounts struct {
	Chunks       uint64 `json:"chunks"`
	Bytes        uint64 `json:"bytes"`
	BadBlocks    uint64 `json:"bad_blocks"`
	Repaired     uint64 `json:"repaired"`
	Unrepairable uint64 `json:"unrepairable"`
	Mismatched   uint64 `json:"mismatched"`
	PeerMissing  uint64 `json:"peer_missing"`
}

func (c *scrubCounts) add(o scrubCounts) {
	c.Chunks += o.Chunks
	c.Bytes += o.Bytes
	c.BadBlocks += o.BadBlocks
	c.Repaired += o.Repaired
	c.Unrepairable += o.Unrepairable
	c.Mismatched += o.Mismatched
	c.PeerMissing += o.PeerMissing
}

// scrubOptions are the flags of one scrub.
type scrubOptions struct {
	Repair    bool
	RateBytes uint64
}

// scrubPage is how many chunks one SScrub call verifies (at most; the
// store also stops after a few seconds).
const scrubPage = 256

// maxScrubProblems bounds the problems kept per target (each call names
// a few; a group out of sync is named by every call).
const maxScrubProblems = 64

// scrubCallTimeout bounds one SScrub call: a directory of large chunks at
// a low rate takes long.
const scrubCallTimeout = 10 * time.Minute

func init() {
	var af adminFlags
	var repair, asJSON, progress bool
	var rate string
	cmd := &cobra.Command{
		Use:   "scrub",
		Short: "Verify every block of every chunk, and both copies of mirrored ones (repair with --repair)",
		Long: `Reads every block of every chunk on the storage servers and checks it against its stored
checksum. For a mirror group the group's primary reads its copy and compares each block with the
secondary's: a block whose checksum fails on one copy and holds on the other is bad on the first,
and --repair rewrites it from the good copy. A block bad on both copies, or on a target in no
group, cannot be repaired and is reported (the file reads EIO there). Reads are paced to --rate
bytes per second per target (0: no limit). Targets in no group are verified alone; targets whose
server is down are listed as not scrubbed. Exit status 1 when bad blocks remain (or blocks that
differ between the copies, or a target could not be scrubbed).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rb, err := parseSize(rate)
			if err != nil {
				return usagef("--rate %q: %v", rate, err)
			}
			meta, key, err := af.resolve()
			if err != nil {
				return err
			}
			pw := progressWriter(cmd, progress)
			opts := scrubOptions{Repair: repair, RateBytes: rb}
			res, err := scrubCluster(cmd.Context(), meta, key, opts, pw)
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(res); err != nil {
					return err
				}
			} else {
				printScrub(os.Stdout, res, repair)
			}
			return scrubVerdict(res, repair)
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&repair, "repair", false, "rewrite bad blocks from the other copy of their mirror group")
	cmd.Flags().StringVar(&rate, "rate", "100MiB", "bytes read per second per target (like 50MiB, 1G; 0: no limit)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&progress, "progress", false, "report progress on stderr after every call to a storage server (default: when stderr is a terminal)")
	rootCmd.AddCommand(cmd)
}

// scrubCluster scrubs the primary copy of every mirror group (against its
// secondary) and every live target in no group, reporting progress to
// progress (nil: nowhere). A metadata service without mirror groups
// (ENOSYS) has every live target scrubbed alone.
func scrubCluster(ctx context.Context, meta string, key []byte, opts scrubOptions, progress io.Writer) ([]*scrubTarget, error) {
	mc, st, err := clusterStatus(ctx, meta, key)
	if err != nil {
		return nil, err
	}
	defer mc.Close()
	var groups rpc.ListGroupsResp
	if err := mc.Call(ctx, rpc.MListGroups, &rpc.Empty{}, &groups); err != nil && !errors.Is(err, syscall.ENOSYS) {
		return nil, fmt.Errorf("mirror groups from %s: %w", meta, err)
	}
	byID := map[uint32]rpc.TargetInfo{}
	for _, ti := range st.Targets {
		byID[ti.ID] = ti
	}
	var todo []*scrubTarget
	inGroup := map[uint32]bool{}
	for _, g := range groups.Groups {
		inGroup[g.Primary], inGroup[g.Secondary] = true, true
		ti := byID[g.Primary]
		r := &scrubTarget{ID: g.Primary, Group: g.ID, Path: ti.Path, Addr: g.PrimaryAddr}
		if !g.PrimaryAlive {
			r.Skipped = "the group's primary server is down"
		}
		todo = append(todo, r)
	}
	for _, ti := range st.Targets {
		if inGroup[ti.ID] {
			continue
		}
		r := &scrubTarget{ID: ti.ID, Path: ti.Path, Addr: ti.Addr}
		if !ti.Alive {
			r.Skipped = "its storage server is down"
		}
		todo = append(todo, r)
	}
	stores := newStoreClients(key)
	defer stores.close()
	start := time.Now()
	for i, r := range todo {
		if r.Skipped == "" {
			if err := scrubTargetChunks(ctx, stores.get(r.Addr), r, opts, progress, start); err != nil {
				if ctx.Err() != nil {
					return todo, err
				}
				r.Skipped = err.Error()
			} else {
				r.Scrubbed = true
			}
		}
		if progress != nil {
			fmt.Fprintf(progress, "scrub: %s, %d of %d: %s (%s)\n", scrubName(r), i+1, len(todo), scrubFigures(r),
				time.Since(start).Round(time.Millisecond))
		}
	}
	return todo, nil
}

// scrubTargetChunks walks r's target with SScrub calls until done.
func scrubTargetChunks(ctx context.Context, sc *transport.Client, r *scrubTarget, opts scrubOptions, progress io.Writer, start time.Time) error {
	for from, calls := uint32(0), 0; ; calls++ {
		if calls > 2*(1<<16) {
			return fmt.Errorf("scrub of target %d does not finish", r.ID)
		}
		cctx, cancel := context.WithTimeout(ctx, scrubCallTimeout)
		var page rpc.ScrubResp
		err := sc.Call(cctx, rpc.SScrub, &rpc.ScrubReq{Target: r.ID, From: from, Max: scrubPage, Repair: opts.Repair,
			RateBytes: opts.RateBytes, Group: r.Group}, &page)
		cancel()
		if err != nil {
			return fmt.Errorf("scrub stopped at directory %d: %w", from, err)
		}
		r.add(scrubCounts{Chunks: page.Chunks, Bytes: page.Bytes, BadBlocks: page.BadBlocks, Repaired: page.Repaired,
			Unrepairable: page.Unrepairable, Mismatched: page.Mismatched, PeerMissing: page.PeerMissing})
		for _, p := range page.Problems {
			if len(r.Problems) < maxScrubProblems && !slices.Contains(r.Problems, p) {
				r.Problems = append(r.Problems, p)
			}
		}
		if page.Done {
			return nil
		}
		if page.Next <= from {
			return fmt.Errorf("scrub does not advance past directory %d", from)
		}
		from = page.Next
		if progress != nil {
			fmt.Fprintf(progress, "scrub: %s: %s so far, at directory %d of %d (%s)\n", scrubName(r), scrubFigures(r), from, 1<<16,
				time.Since(start).Round(time.Second))
		}
	}
}

func scrubName(r *scrubTarget) string {
	if r.Group != 0 {
		return fmt.Sprintf("group %d (primary target %d, %s on %s)", r.Group, r.ID, r.Path, r.Addr)
	}
	return fmt.Sprintf("target %d (%s on %s)", r.ID, r.Path, r.Addr)
}

func scrubFigures(r *scrubTarget) string {
	if r.Skipped != "" && !r.Scrubbed && r.Chunks == 0 {
		return "not scrubbed: " + r.Skipped
	}
	s := fmt.Sprintf("%d chunks, %s, %d bad blocks, %d repaired, %d unrepairable", r.Chunks, humanBytes(r.Bytes),
		r.BadBlocks, r.Repaired, r.Unrepairable)
	if r.Mismatched > 0 {
		s += fmt.Sprintf(", %d differing", r.Mismatched)
	}
	if r.Skipped != "" {
		s += "; not finished: " + r.Skipped
	}
	return s
}

func printScrub(out io.Writer, res []*scrubTarget, repair bool) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TARGET\tGROUP\tPATH\tSERVER\tCHUNKS\tBYTES\tBAD BLOCKS\tREPAIRED\tUNREPAIRABLE\tDIFFERING")
	var t scrubCounts
	unscrubbed := 0
	for _, r := range res {
		group := "-"
		if r.Group != 0 {
			group = fmt.Sprint(r.Group)
		}
		if !r.Scrubbed {
			unscrubbed++
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\tnot scrubbed: %s\t\t\t\t\t\n", r.ID, group, r.Path, r.Addr, r.Skipped)
			continue
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t%d\n", r.ID, group, r.Path, r.Addr, r.Chunks, humanBytes(r.Bytes),
			r.BadBlocks, r.Repaired, r.Unrepairable, r.Mismatched)
		t.add(r.scrubCounts)
	}
	w.Flush()
	for _, r := range res {
		for _, p := range r.Problems {
			fmt.Fprintf(out, "%s: %s\n", scrubName(r), p)
		}
	}
	fmt.Fprintf(out, "%d chunks (%s) verified: %d bad blocks, %d repaired, %d unrepairable", t.Chunks, humanBytes(t.Bytes),
		t.BadBlocks, t.Repaired, t.Unrepairable)
	if t.Mismatched > 0 {
		fmt.Fprintf(out, ", %d blocks differ between copies", t.Mismatched)
	}
	if t.PeerMissing > 0 {
		fmt.Fprintf(out, ", %d chunks without a second copy", t.PeerMissing)
	}
	fmt.Fprintln(out)
	if left := t.BadBlocks - t.Repaired - t.Unrepairable; !repair && left > 0 {
		fmt.Fprintf(out, "%d bad blocks have a good copy; run again with --repair to rewrite them\n", left)
	}
	if unscrubbed > 0 {
		fmt.Fprintf(out, "%d targets not scrubbed\n", unscrubbed)
	}
}

// scrubVerdict is the command's error (exit status 1) when bad blocks
// remain, copies differ, or a target was not scrubbed.
func scrubVerdict(res []*scrubTarget, repair bool) error {
	var t scrubCounts
	unscrubbed := 0
	for _, r := range res {
		t.add(r.scrubCounts)
		if !r.Scrubbed {
			unscrubbed++
		}
	}
	switch {
	case t.Unrepairable > 0:
		return fmt.Errorf("scrub: %d bad blocks cannot be repaired (no good copy)", t.Unrepairable)
	case t.BadBlocks > t.Repaired && repair:
		return fmt.Errorf("scrub: %d bad blocks were not repaired", t.BadBlocks-t.Repaired)
	case t.BadBlocks > t.Repaired:
		return fmt.Errorf("scrub: %d bad blocks found (repairable with --repair)", t.BadBlocks-t.Repaired)
	case t.Mismatched > 0:
		return fmt.Errorf("scrub: %d blocks differ between the copies of their group", t.Mismatched)
	case unscrubbed > 0:
		return fmt.Errorf("scrub: %d targets not scrubbed", unscrubbed)
	}
	return nil
}
