package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// The membership commands of the metadata group: strata meta members,
// add-voter, remove-voter and transfer-leader. They take the addresses
// --meta gives (a comma-separated list), ask every voter directly for
// MMetaInfo, and send changes to whichever answers as the leader.

const (
	// infoTimeout bounds one voter's MMetaInfo answer.
	infoTimeout = 3 * time.Second
	// leaderSearch bounds the search for a leader that takes a change
	// (an election may be under way).
	leaderSearch = 15 * time.Second
)

func init() {
	var metaCmd *cobra.Command
	for _, c := range rootCmd.Commands() {
		if c.Name() == "meta" {
			metaCmd = c
		}
	}
	if metaCmd == nil {
		panic("metaadmin.go: the meta command must be registered first (meta.go)")
	}

	var mf adminFlags
	var asJSON bool
	members := &cobra.Command{
		Use:   "members",
		Short: "List the metadata voters: state, term, applied index, lag behind the leader, last contact",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			addrs, key, err := mf.metaAddrs()
			if err != nil {
				return err
			}
			ms := admin.Members(cmd.Context(), addrs, metaInfoAsker(key), infoTimeout)
			var st admin.MetaStatus
			if !admin.SetMembers(&st, ms) {
				return fmt.Errorf("no metadata voter answered: %s", unreachableText(ms))
			}
			if asJSON {
				return printJSON(membersDoc{Leader: st.Leader, Term: st.Term, Voters: st.Voters, LastLeaderChange: st.LastLeaderChange})
			}
			printMembers(os.Stdout, st, ms)
			return nil
		},
	}
	mf.register(members)
	members.Flags().BoolVar(&asJSON, "json", false, "print JSON (as the \"meta\" member of strata status --json: leader, term, voters, last_leader_change)")

	change := func(use, short string, method rpc.Method, args cobra.PositionalArgs) *cobra.Command {
		var af adminFlags
		c := &cobra.Command{
			Use: use, Short: short, Args: args,
			RunE: func(cmd *cobra.Command, args []string) error {
				addrs, key, err := af.metaAddrs()
				if err != nil {
					return err
				}
				req := &rpc.MembershipReq{}
				if len(args) > 0 {
					req.Addr = args[0]
				}
				start := time.Now()
				resp, err := changeMembership(cmd.Context(), addrs, key, method, req)
				if err != nil {
					return fmt.Errorf("%s: %w", cmd.Name(), err)
				}
				printChange(os.Stdout, method, resp, time.Since(start))
				return nil
			},
		}
		af.register(c)
		return c
	}
	metaCmd.AddCommand(members,
		change("add-voter ADDR", "Add the metadata service at ADDR (its --listen address) to the group as a voter", rpc.MAddVoter, cobra.ExactArgs(1)),
		change("remove-voter ADDR", "Remove the voter at ADDR from the group (the leader hands leadership over first)", rpc.MRemoveVoter, cobra.ExactArgs(1)),
		change("transfer-leader [ADDR]", "Hand leadership to ADDR, or to the most caught-up voter: a planned switch for maintenance", rpc.MTransferLeader, cobra.MaximumNArgs(1)),
	)
}

// membersDoc is strata meta members --json: the members of strata status
// --json's "meta" that the voters' own answers give.
type membersDoc struct {
	Leader           string              `json:"leader"`
	Term             uint64              `json:"term"`
	Voters           []admin.Voter       `json:"voters"`
	LastLeaderChange *admin.LeaderChange `json:"last_leader_change"`
}

// metaAddrs is the list of metadata addresses (--meta A,B,C, or as found)
// and the cluster key.
func (a *adminFlags) metaAddrs() ([]string, []byte, error) {
	meta, key, err := a.resolve()
	if err != nil {
		return nil, nil, err
	}
	var addrs []string
	for _, s := range strings.Split(meta, ",") {
		if s = strings.TrimSpace(s); s != "" {
			addrs = append(addrs, s)
		}
	}
	if len(addrs) == 0 {
		return nil, nil, usagef("no metadata address in %q", meta)
	}
	return addrs, key, nil
}

// metaInfoAsker asks one voter for MMetaInfo with the cluster key.
func metaInfoAsker(key []byte) admin.AskFunc {
	return func(ctx context.Context, addr string) (*rpc.MetaInfoResp, error) {
		c := adminClient(addr, key)
		defer c.Close()
		var r rpc.MetaInfoResp
		if err := c.Call(ctx, rpc.MMetaInfo, &rpc.Empty{}, &r); err != nil {
			return nil, err
		}
		return &r, nil
	}
}

// metaMembers asks the voters for strata status (nil when the cluster's
// addresses cannot be found).
func metaMembers(ctx context.Context, a *adminFlags) []admin.Member {
	addrs, key, err := a.metaAddrs()
	if err != nil {
		return nil
	}
	return admin.Members(ctx, addrs, metaInfoAsker(key), infoTimeout)
}

// changeMembership sends a membership change to the leader: it tries the
// addresses in turn, follows a not-the-leader answer's hint, and waits
// out an election (bounded by leaderSearch). A refusal by the leader
// (the change is not possible) ends the search.
func changeMembership(ctx context.Context, addrs []string, key []byte, method rpc.Method, req *rpc.MembershipReq) (*rpc.MembershipResp, error) {
	ctx, cancel := context.WithTimeout(ctx, leaderSearch)
	defer cancel()
	var errs []string
	for {
		queue := append([]string(nil), addrs...)
		tried := map[string]bool{}
		for len(queue) > 0 {
			addr := queue[0]
			queue = queue[1:]
			if tried[addr] {
				continue
			}
			tried[addr] = true
			var resp rpc.MembershipResp
			c := transport.NewClient(addr, transport.ClientConfig{Key: key, TLS: adminTLS, Conns: 1, DialTimeout: infoTimeout, CallTimeout: leaderSearch})
			err := c.Call(ctx, method, req, &resp)
			c.Close()
			switch {
			case err == nil:
				return &resp, nil
			case errors.Is(err, syscall.ENOTCONN):
				if h := rpc.LeaderHint(err); h != "" {
					queue = append([]string{h}, queue...)
				}
				errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
			case errors.Is(err, syscall.ENOSYS):
				return nil, fmt.Errorf("the metadata service at %s does not support membership changes (an older build): %w", addr, err)
			case errors.Is(err, transport.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded):
				errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
			default:
				return nil, err // the leader refused: say why
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no metadata leader took the change within %v: %s", leaderSearch, strings.Join(lastN(errs, len(addrs)+1), "; "))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// lastN is the last n strings of s.
func lastN(s []string, n int) []string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// printChange says what a membership change did.
func printChange(out io.Writer, method rpc.Method, resp *rpc.MembershipResp, took time.Duration) {
	fmt.Fprintln(out, resp.Done)
	if method == rpc.MTransferLeader {
		fmt.Fprintf(out, "leader: %s (the switch took %v)\n", resp.Leader, time.Duration(resp.TookNs).Round(time.Millisecond))
		return
	}
	var vs []string
	for _, v := range resp.Voters {
		if v.Voter {
			a := v.Addr
			if a == "" {
				a = v.ID
			}
			vs = append(vs, a)
		}
	}
	fmt.Fprintf(out, "voters: %s; leader: %s (took %v)\n", strings.Join(vs, ", "), resp.Leader, took.Round(time.Millisecond))
}

// unreachableText says why each member did not answer.
func unreachableText(ms []admin.Member) string {
	var out []string
	for _, m := range ms {
		if m.Err != nil {
			out = append(out, fmt.Sprintf("%s: %v", m.Address, m.Err))
		}
	}
	return strings.Join(out, "; ")
}

// printMembers is strata meta members' table, and the lines of strata
// status' metadata section.
func printMembers(out io.Writer, st admin.MetaStatus, ms []admin.Member) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "VOTER\tSTATE\tTERM\tAPPLIED\tLAG\tLAST CONTACT")
	for _, v := range st.Voters {
		if v.State == admin.StateUnreachable {
			fmt.Fprintf(w, "%s\t%s\t-\t-\t-\t%s\n", v.Address, v.State, v.Error)
			continue
		}
		lag, contact := "-", "-"
		if v.Lag != nil {
			lag = fmt.Sprint(*v.Lag)
		}
		if v.LastContactSeconds != nil && v.State != "leader" {
			contact = (time.Duration(*v.LastContactSeconds*1e3) * time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\n", v.Address, v.State, v.Term, v.AppliedIndex, lag, contact)
		for _, h := range v.Health {
			fmt.Fprintf(w, "\tFAILING: %s\t\t\t\t\n", h)
		}
	}
	w.Flush()
	for _, m := range ms {
		if !m.InConfig {
			what := "unreachable"
			if m.Info != nil {
				what = m.Info.State + ", not in the configuration"
			}
			fmt.Fprintf(out, "(%s was given but is not a voter: %s)\n", m.Address, what)
		}
	}
	fmt.Fprintln(out, leaderLine(st))
}

// leaderLine: the leader, term and the last leader change.
func leaderLine(st admin.MetaStatus) string {
	leader := st.Leader
	if leader == "" {
		leader = "none known"
	}
	s := fmt.Sprintf("leader %s, term %d", leader, st.Term)
	if c := st.LastLeaderChange; c != nil {
		when := c.Time
		if t, err := time.Parse(time.RFC3339Nano, c.Time); err == nil {
			when = time.Since(t).Round(time.Second).String() + " ago"
		}
		s += fmt.Sprintf("; last leader change %s: %s (seen by %s)", when, c.Cause, c.Voter)
	}
	return s
}

// printMetaSection is strata status' section on the metadata group
// (nothing when no voter described it: an older service).
func printMetaSection(out io.Writer, ms []admin.Member) {
	var st admin.MetaStatus
	if !admin.SetMembers(&st, ms) {
		return
	}
	printMembers(out, st, ms)
	fmt.Fprintln(out)
}
