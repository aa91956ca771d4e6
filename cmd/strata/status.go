package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

// adminFlags locate a running cluster for the admin commands (see
// admin.Locate): --meta and --key-file, else $STRATA_META /
// $STRATA_KEY_FILE, else --data's cluster.json, else the Strata mount the
// working directory is on, else ./strata-data, else the one strata up
// running on this machine.
type adminFlags struct {
	meta    string
	keyFile string
	data    string
	tls     tlsFlags
}

func (a *adminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.meta, "meta", "", metaFlagUsage+" (default $STRATA_META, the mount the working directory is on, or the running strata up)")
	cmd.Flags().StringVar(&a.keyFile, "key-file", "", "cluster key file (default $STRATA_KEY_FILE, or the one the mount or strata up was started with)")
	cmd.Flags().StringVar(&a.data, "data", "", "data directory of a local cluster started by strata up (default: ./strata-data if present)")
	a.tls.register(cmd.Flags())
}

// dial returns a caller of the metadata service found (its leader).
func (a *adminFlags) dial() (*transport.Multi, error) {
	meta, key, err := a.resolve()
	if err != nil {
		return nil, err
	}
	return adminMetaClient(meta, key), nil
}

// adminMetaClient is adminClient for the metadata service whose voters
// meta lists (as resolve returns it: checked, comma-separated): calls go
// to the leader among them.
func adminMetaClient(meta string, key []byte) *transport.Multi {
	return transport.NewMulti(strings.Split(meta, ","), transport.MultiConfig{ClientConfig: adminClientConfig(key), AttemptTimeout: 3 * time.Second})
}

// adminClient is a client of a cluster's service at addr for the admin
// commands: one connection, short timeouts.
func adminClient(addr string, key []byte) *transport.Client {
	return transport.NewClient(addr, adminClientConfig(key))
}

func adminClientConfig(key []byte) transport.ClientConfig {
	return transport.ClientConfig{Key: key, TLS: adminTLS, Conns: 1, DialTimeout: 3 * time.Second, CallTimeout: 10 * time.Second}
}

// resolve finds the metadata service's addresses (its voters; returned
// checked and comma-separated, as --meta takes them) and the cluster key.
func (a *adminFlags) resolve() (string, []byte, error) {
	wd, _ := os.Getwd()
	c, err := admin.Locate(admin.Query{Meta: a.meta, KeyFile: a.keyFile, Data: a.data, Dir: wd})
	if err != nil {
		if errors.Is(err, admin.ErrNoCluster) || errors.Is(err, admin.ErrNoPath) || errors.Is(err, admin.ErrBadMeta) {
			return "", nil, usageError{err}
		}
		return "", nil, err
	}
	key, err := readKeyFile(c.KeyFile)
	if err != nil {
		return "", nil, err
	}
	if _, err := a.tls.load(); err != nil {
		return "", nil, err
	}
	slog.Debug("cluster located", "meta", c.MetaAddrs, "key_file", c.KeyFile, "from", c.From)
	return strings.Join(c.MetaAddrs, ","), key, nil
}

func init() {
	var af adminFlags
	var asJSON, showLocks bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the metadata service, storage servers, targets, capacity and health",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			var st rpc.ClusterStatusResp
			if err := c.Call(cmd.Context(), rpc.MClusterStatus, &rpc.Empty{}, &st); err != nil {
				return fmt.Errorf("cluster status from %s: %w", c.Addr(), err)
			}
			var fs rpc.StatFSResp
			if err := c.Call(cmd.Context(), rpc.MStatFS, &rpc.Empty{}, &fs); err != nil {
				return fmt.Errorf("capacity from %s: %w", c.Addr(), err)
			}
			members := metaMembers(cmd.Context(), &af)
			if asJSON {
				doc := admin.StatusOf(&st, fs, showLocks)
				admin.SetMembers(&doc.Meta, members)
				return printJSON(doc)
			}
			printMetaSection(os.Stdout, members)
			printStatus(os.Stdout, &st, admin.CapacityOf(fs), showLocks)
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the fields: README, JSON output)")
	cmd.Flags().BoolVar(&showLocks, "locks", false, "list the file locks held (fcntl and flock), with the client holding each")
	rootCmd.AddCommand(cmd)
}

// printJSON prints v indented, for the admin commands' --json.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printStatus(out io.Writer, st *rpc.ClusterStatusResp, capa admin.Capacity, showLocks bool) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "metadata\t%s\traft %s, term %d, commit %d, applied %d, durable %d (%d not yet synced)\tinodes %d, sessions %d\n",
		st.MetaAddr, st.RaftState, st.Term, st.CommitIndex, st.AppliedIndex, st.DurableIndex, admin.UnsyncedEntries(st), st.Inodes, st.Sessions)
	if len(st.Problems) == 0 {
		fmt.Fprintln(w, "\thealth ok")
	}
	for _, p := range st.Problems {
		fmt.Fprintf(w, "\tFAILING: %s\n", p)
	}
	fmt.Fprintf(w, "\tto free: %d removed files, %s (the background reaper frees them)\n", st.FreePendingFiles, humanBytes(st.FreePendingBytes))
	w.Flush()
	fmt.Fprintln(out)
	fmt.Fprintln(w, "SERVER\tADDRESS\tHOST\tHEALTH\tLAST SEEN")
	for _, s := range st.Servers {
		seen := "-" // no heartbeat since this node leads
		if s.LastSeenMs >= 0 {
			seen = (time.Duration(s.LastSeenMs) * time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", s.ID, s.Addr, s.Host, health(s.Alive), seen)
	}
	w.Flush()
	fmt.Fprintln(out)
	// AVAIL is what writes may still use: the free space less the
	// target's reserve, below which it answers ENOSPC. The total is df's.
	// UNSYNCED is what the target's server holds written but not yet
	// durable (it syncs it within its --sync-interval).
	fmt.Fprintln(w, "TARGET\tSERVER\tPATH\tSIZE\tUSED\tAVAIL\tUSE%\tHEALTH\tUNSYNCED")
	for i, t := range st.Targets {
		var u rpc.TargetUnsynced
		if i < len(st.Unsynced) {
			u = st.Unsynced[i]
		}
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t-\t%s\t-\t%s\t%s\n", t.ID, t.ServerID, t.Path, humanBytes(t.TotalBytes), humanBytes(t.FreeBytes), health(t.Alive), unsyncedText(u))
	}
	fmt.Fprintf(w, "total\t\t\t%s\t%s\t%s\t%.1f%%\t\t\n", humanBytes(capa.SizeBytes), humanBytes(capa.UsedBytes), humanBytes(capa.AvailBytes), capa.UsedPercent)
	w.Flush()
	fmt.Fprintln(out, "(as df on the mount: targets on one file system of one host count once; AVAIL is what writes may use, above each target's reserve;")
	fmt.Fprintln(out, " UNSYNCED is written and not yet durable: each storage server syncs it within its --sync-interval)")
	fmt.Fprintln(out)
	if len(st.Groups) > 0 {
		printGroups(out, st.Groups)
		fmt.Fprintln(out)
	}
	printClients(out, st, showLocks)
}

// printDelegations lists the directory create delegations held
// (docs/design/0016), if any.
func printDelegations(out io.Writer, st *rpc.ClusterStatusResp) {
	if len(st.Delegations) == 0 {
		return
	}
	var ds []string
	for _, d := range st.Delegations {
		s := fmt.Sprintf("directory %d (client %d", d.Dir, d.Client)
		if d.Recalled {
			s += ", recalled"
		}
		ds = append(ds, s+")")
	}
	fmt.Fprintf(out, "create delegations: %s\n\n", strings.Join(ds, ", "))
}

// printNFSGateways lists the sessions that are NFS gateways (strata nfs
// and strata up --nfs open theirs with MountPoint nfs://ADDR), then what
// each reported with its last heartbeat: NFS clients seen in the last 5
// minutes, calls a second, calls since it started, and its exports.
func printNFSGateways(out io.Writer, st *rpc.ClusterStatusResp) {
	var gws []string
	for _, c := range st.Clients {
		if addr, ok := strings.CutPrefix(c.MountPoint, "nfs://"); ok {
			gws = append(gws, fmt.Sprintf("%s (client %d on %s)", addr, c.ID, c.Host))
		}
	}
	if len(gws) == 0 {
		return
	}
	fmt.Fprintf(out, "nfs gateways: %s\n", strings.Join(gws, ", "))
	reports := admin.NFSGatewaysOf(st)
	if len(reports) == 0 {
		fmt.Fprintln(out, "(no gateway has reported its exports and calls yet: they come with its next heartbeat; older gateways never send them)")
		fmt.Fprintln(out)
		return
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  GATEWAY\tCLIENT\tNFS CLIENTS\tOPS/S\tCALLS\tEXPORTS")
	for _, g := range reports {
		exports := strings.Join(g.Exports, "  ")
		if exports == "" {
			exports = "-"
		}
		fmt.Fprintf(w, "  %s\t%d\t%d\t%d\t%d\t%s\n", g.Address, g.Client, g.NFSClients, g.OpsPerSecond, g.Ops, exports)
	}
	w.Flush()
	fmt.Fprintln(out)
}

// printClients shows the mounts, the lock summary and, with showLocks, the
// locks themselves.
func printClients(out io.Writer, st *rpc.ClusterStatusResp, showLocks bool) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	hosts := map[uint64]string{}
	fmt.Fprintln(w, "CLIENT\tHOST\tMOUNT\tPID\tLAST SEEN\tOPEN FILES\tLOCKS")
	for _, c := range st.Clients {
		hosts[c.ID] = c.Host
		seen := "-" // this node is not the leader: it has no heartbeats
		if c.LastSeenMs >= 0 {
			seen = (time.Duration(c.LastSeenMs) * time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%d\t%d\n", c.ID, c.Host, c.MountPoint, c.Pid, seen, c.OpenFiles, c.Locks)
	}
	w.Flush()
	fmt.Fprintln(out)
	printDelegations(out, st)
	printNFSGateways(out, st)
	switch {
	case st.LockGrace:
		fmt.Fprintf(out, "locks: %d held; grace period after a metadata restart: new locks wait until %d client(s) have reclaimed theirs\n", st.LocksTotal, st.LockGracePending)
	default:
		fmt.Fprintf(out, "locks: %d held\n", st.LocksTotal)
	}
	if !showLocks {
		if st.LocksTotal > 0 {
			fmt.Fprintln(out, "(strata status --locks lists them)")
		}
		return
	}
	if len(st.Locks) == 0 {
		return
	}
	fmt.Fprintln(out)
	fmt.Fprintln(w, "INODE\tKIND\tTYPE\tRANGE\tCLIENT\tHOST\tPID")
	for _, l := range st.Locks {
		kind, typ := "fcntl", "read"
		if l.Flock {
			kind = "flock"
		}
		if l.Type == rpc.LockWrite {
			typ = "write"
		}
		pid := "-"
		if l.Pid != 0 {
			pid = fmt.Sprint(l.Pid)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", l.Ino, kind, typ, lockRange(l.Start, l.End), l.Client, hosts[l.Client], pid)
	}
	w.Flush()
	if int(st.LocksTotal) > len(st.Locks) {
		fmt.Fprintf(out, "(first %d of %d locks)\n", len(st.Locks), st.LocksTotal)
	}
}

// lockRange shows an inclusive byte range; "EOF" for a lock to the end of
// the file, however it grows.
func lockRange(start, end uint64) string {
	if end == math.MaxUint64 {
		return fmt.Sprintf("%d-EOF", start)
	}
	return fmt.Sprintf("%d-%d", start, end)
}

func health(alive bool) string {
	if alive {
		return "up"
	}
	return "DOWN"
}

func humanBytes(b uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v := float64(b)
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", b)
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0") + " " + units[i]
}

// unsyncedText shows a target's unsynced figures: "none", or e.g.
// "123 chunks, 4.5 MiB, oldest 3s".
func unsyncedText(u rpc.TargetUnsynced) string {
	if u.Chunks == 0 {
		return "none"
	}
	age := (time.Duration(u.OldestMs) * time.Millisecond).Round(time.Second)
	return fmt.Sprintf("%d chunks, %s, oldest %s", u.Chunks, humanBytes(u.Bytes), age)
}
