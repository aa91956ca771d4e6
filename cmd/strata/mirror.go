package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// strata mirror: the mirror groups' admin commands (docs/design/0014).
// Thin: each sends one request to the metadata leader and prints the
// groups it answers.

func init() {
	mirror := &cobra.Command{
		Use:   "mirror",
		Short: "Mirror groups: pairs of targets on different servers holding the same chunks",
	}

	var cf adminFlags
	var auto, byDomain bool
	var targets string
	create := &cobra.Command{
		Use:   "create --auto [--domain] | --targets P,S[,P,S...]",
		Short: "Pair targets into mirror groups: every unpaired target with one on another server (--auto), or the pairs given (primary first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &rpc.MirrorCreateReq{Auto: auto, ByDomain: byDomain}
			switch {
			case auto && targets != "":
				return usagef("mirror create: give --auto or --targets, not both")
			case !auto && targets == "":
				return usagef("mirror create: give --auto (pair every unpaired target across servers) or --targets P,S[,P,S...]")
			case targets != "":
				ids, err := parseTargetIDs(targets)
				if err != nil {
					return usagef("mirror create: --targets %q: %v", targets, err)
				}
				if len(ids)%2 != 0 {
					return usagef("mirror create: --targets %q: %d ids; give pairs of primary and secondary", targets, len(ids))
				}
				req.Pairs = ids
			}
			c, err := cf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			var resp rpc.ListGroupsResp
			if err := c.Call(cmd.Context(), rpc.MMirrorCreate, req, &resp); err != nil {
				return fmt.Errorf("mirror create: %w", err)
			}
			if len(resp.Groups) == 0 {
				fmt.Println("no new mirror group: every target is paired already, or none is left on another server (or domain)")
				return nil
			}
			fmt.Printf("created %d mirror group(s):\n", len(resp.Groups))
			printGroups(os.Stdout, resp.Groups)
			return nil
		},
	}
	cf.register(create)
	create.Flags().BoolVar(&auto, "auto", false, "pair every target in no group with one on another storage server")
	create.Flags().BoolVar(&byDomain, "domain", false, "pair only across failure domains (strata store --domain)")
	create.Flags().StringVar(&targets, "targets", "", "target ids as primary,secondary pairs: P,S[,P,S...]")

	var lf adminFlags
	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the mirror groups: copies, state, epoch",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := lf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			gs, err := listGroups(cmd.Context(), c)
			if err != nil {
				return err
			}
			if asJSON {
				doc := make([]admin.MirrorGroup, 0, len(gs))
				for i := range gs {
					doc = append(doc, admin.MirrorGroupOf(&gs[i]))
				}
				return printJSON(doc)
			}
			if len(gs) == 0 {
				fmt.Println("no mirror groups (strata mirror create --auto pairs the targets)")
				return nil
			}
			printGroups(os.Stdout, gs)
			return nil
		},
	}
	lf.register(list)
	list.Flags().BoolVar(&asJSON, "json", false, `print JSON: the "mirror_groups" list of strata status --json`)

	var ff adminFlags
	failOver := &cobra.Command{
		Use:   "fail-over GROUP",
		Short: "Make an in-sync group's secondary its primary: a planned switch (maintenance of the primary's server)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseGroupID(args[0])
			if err != nil {
				return err
			}
			c, err := ff.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			g, err := failOverGroup(cmd.Context(), c, id)
			if err != nil {
				return fmt.Errorf("mirror fail-over %d: %w", id, err)
			}
			fmt.Printf("mirror group %d: primary now target %d on %s (epoch %d)\n", g.ID, g.Primary, g.PrimaryAddr, g.Epoch)
			return nil
		},
	}
	ff.register(failOver)

	var rf adminFlags
	var target uint32
	replace := &cobra.Command{
		Use:   "replace GROUP --target ID",
		Short: "Give a degraded group an empty target in place of its out-of-sync copy; the primary fills it completely",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseGroupID(args[0])
			if err != nil {
				return err
			}
			if target == 0 {
				return usagef("mirror replace: --target ID is required (strata status lists the targets)")
			}
			c, err := rf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			var g rpc.GroupInfo
			err = c.Call(cmd.Context(), rpc.MMirrorReplace, &rpc.MirrorReplaceReq{Group: id, Target: target}, &g)
			if errors.Is(err, syscall.EINVAL) {
				// Sent again after a leader change, the replacement
				// already made is refused: that is success.
				if now, lerr := findGroup(cmd.Context(), c, id); lerr == nil && now.Secondary == target {
					g, err = now, nil
				}
			}
			if err != nil {
				return fmt.Errorf("mirror replace %d: %w", id, err)
			}
			fmt.Printf("mirror group %d: secondary now target %d on %s, %s (epoch %d); it resyncs from the primary once its server heartbeats\n",
				g.ID, g.Secondary, g.SecondaryAddr, groupStateText(&g), g.Epoch)
			return nil
		},
	}
	rf.register(replace)
	replace.Flags().Uint32Var(&target, "target", 0, "id of the empty target that takes the place of the group's out-of-sync copy")

	mirror.AddCommand(create, list, failOver, replace)
	rootCmd.AddCommand(mirror)
}

// failOverGroup switches group id from the epoch it has now; a request
// sent again after a leader change is refused with ESTALE once the first
// was applied, which is then success.
func failOverGroup(ctx context.Context, c *transport.Multi, id uint32) (rpc.GroupInfo, error) {
	before, err := findGroup(ctx, c, id)
	if err != nil {
		return rpc.GroupInfo{}, err
	}
	var g rpc.GroupInfo
	err = c.Call(ctx, rpc.MMirrorFailOver, &rpc.MirrorGroupReq{Group: id, Epoch: before.Epoch}, &g)
	if errors.Is(err, syscall.ESTALE) {
		if now, lerr := findGroup(ctx, c, id); lerr == nil && now.Epoch == before.Epoch+1 && now.Primary == before.Secondary {
			return now, nil
		}
	}
	return g, err
}

func listGroups(ctx context.Context, c *transport.Multi) ([]rpc.GroupInfo, error) {
	var resp rpc.ListGroupsResp
	if err := c.Call(ctx, rpc.MListGroups, &rpc.Empty{}, &resp); err != nil {
		return nil, fmt.Errorf("list mirror groups: %w", err)
	}
	return resp.Groups, nil
}

func findGroup(ctx context.Context, c *transport.Multi, id uint32) (rpc.GroupInfo, error) {
	gs, err := listGroups(ctx, c)
	if err != nil {
		return rpc.GroupInfo{}, err
	}
	for _, g := range gs {
		if g.ID == id {
			return g, nil
		}
	}
	return rpc.GroupInfo{}, fmt.Errorf("no mirror group %d (strata mirror list shows them)", id)
}

func parseGroupID(s string) (uint32, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 31)
	if err != nil || n == 0 {
		return 0, usagef("%q is not a mirror group number (strata mirror list shows them)", s)
	}
	return uint32(n), nil
}

func parseTargetIDs(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 31)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q is not a target id", f)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

// printGroups shows one line per group (strata status, strata mirror).
func printGroups(out io.Writer, gs []rpc.GroupInfo) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tPRIMARY\tSECONDARY\tSTATE\tEPOCH")
	for i := range gs {
		g := &gs[i]
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\n", g.ID, copyText(g.Primary, g.PrimaryAddr, g.PrimaryAlive),
			copyText(g.Secondary, g.SecondaryAddr, g.SecondaryAlive), groupStateText(g), g.Epoch)
	}
	w.Flush()
}

func copyText(target uint32, addr string, alive bool) string {
	s := fmt.Sprintf("target %d on %s", target, addr)
	if !alive {
		s += " (DOWN)"
	}
	return s
}

// groupStateText: "in sync", "degraded since T", "resyncing 43%".
func groupStateText(g *rpc.GroupInfo) string {
	switch g.State {
	case rpc.GroupInSync:
		return "in sync"
	case rpc.GroupDegraded:
		return "degraded since " + time.UnixMilli(g.SinceMs).UTC().Format(time.RFC3339)
	case rpc.GroupResyncing:
		m := admin.MirrorGroupOf(g)
		if g.ResyncTotal == 0 {
			return "resyncing (starting)"
		}
		return fmt.Sprintf("resyncing %.0f%% (%s of %s)", m.ResyncPercent, humanBytes(g.ResyncDone), humanBytes(g.ResyncTotal))
	}
	return rpc.GroupStateName(g.State)
}
