package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratafs/strata/internal/rpc"
)

// adminFlags locate a running cluster for the admin commands: --meta and
// --key-file, else $STRATA_META / $STRATA_KEY_FILE, else the cluster file
// that `strata up` writes in --data (default ./strata-data).
type adminFlags struct {
	meta    string
	keyFile string
	data    string
	tls     tlsFlags
}

func (a *adminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.meta, "meta", "", "metadata service address (default $STRATA_META or the local cluster's)")
	cmd.Flags().StringVar(&a.keyFile, "key-file", "", "cluster key file (default $STRATA_KEY_FILE or the local cluster's)")
	cmd.Flags().StringVar(&a.data, "data", "./strata-data", "data directory of a local cluster started by `strata up`")
	a.tls.register(cmd.Flags())
}

// upInfo is what `strata up` records in DATA/cluster.json.
type upInfo struct {
	Meta    string `json:"meta"`
	KeyFile string `json:"key_file"`
	Mount   string `json:"mount"`
	Pid     int    `json:"pid"`
}

func (a *adminFlags) dial() (*rpc.Client, error) {
	meta, key, err := a.resolve()
	if err != nil {
		return nil, err
	}
	return adminClient(meta, key), nil
}

// adminClient is a client of a cluster's service at addr for the admin
// commands: one connection, short timeouts.
func adminClient(addr string, key []byte) *rpc.Client {
	return rpc.NewClient(addr, rpc.ClientConfig{Key: key, TLS: adminTLS, Conns: 1, DialTimeout: 3 * time.Second, CallTimeout: 10 * time.Second})
}

// resolve finds the metadata service's address and the cluster key.
func (a *adminFlags) resolve() (string, []byte, error) {
	meta, keyFile := a.meta, a.keyFile
	if meta == "" {
		meta = os.Getenv("STRATA_META")
	}
	if keyFile == "" {
		keyFile = os.Getenv("STRATA_KEY_FILE")
	}
	if meta == "" || keyFile == "" {
		if b, err := os.ReadFile(filepath.Join(a.data, "cluster.json")); err == nil {
			var info upInfo
			if json.Unmarshal(b, &info) == nil {
				if meta == "" {
					meta = info.Meta
				}
				if keyFile == "" {
					keyFile = info.KeyFile
				}
			}
		}
	}
	if meta == "" {
		if _, err := os.Stat(filepath.Join(a.data, "cluster.key")); err == nil {
			// A local cluster's directory without its cluster.json,
			// which strata up writes while it runs.
			return "", nil, fmt.Errorf("no strata up is running on %s (start it: strata up --data %s), or pass --meta ADDR for another cluster", a.data, a.data)
		}
		return "", nil, usagef("no metadata service address: pass --meta ADDR, set STRATA_META, or run from the directory holding strata-data/")
	}
	key, err := readKeyFile(keyFile)
	if err != nil {
		return "", nil, err
	}
	if _, err := a.tls.load(); err != nil {
		return "", nil, err
	}
	return meta, key, nil
}

func init() {
	var af adminFlags
	var asJSON, showLocks bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "show the metadata service, storage servers, targets, capacity and health",
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
			if asJSON {
				return printJSON(st)
			}
			printStatus(os.Stdout, &st, showLocks)
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&showLocks, "locks", false, "list the file locks held (fcntl and flock), with the client holding each")
	rootCmd.AddCommand(cmd)
}

// printJSON prints v indented, for the admin commands' --json.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printStatus(out io.Writer, st *rpc.ClusterStatusResp, showLocks bool) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "metadata\t%s\traft %s, term %d, commit %d, applied %d, durable %d\tinodes %d, sessions %d\n",
		st.MetaAddr, st.RaftState, st.Term, st.CommitIndex, st.AppliedIndex, st.DurableIndex, st.Inodes, st.Sessions)
	if len(st.Problems) == 0 {
		fmt.Fprintln(w, "\thealth ok")
	}
	for _, p := range st.Problems {
		fmt.Fprintf(w, "\tFAILING: %s\n", p)
	}
	w.Flush()
	fmt.Fprintln(out)
	fmt.Fprintln(w, "SERVER\tADDRESS\tHOST\tHEALTH\tLAST SEEN")
	for _, s := range st.Servers {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s ago\n", s.ID, s.Addr, s.Host, health(s.Alive), time.Duration(s.LastSeenMs)*time.Millisecond)
	}
	w.Flush()
	fmt.Fprintln(out)
	var total, free uint64
	fmt.Fprintln(w, "TARGET\tSERVER\tPATH\tSIZE\tFREE\tUSED%\tHEALTH")
	for _, t := range st.Targets {
		total += t.TotalBytes
		free += t.FreeBytes
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.ServerID, t.Path, humanBytes(t.TotalBytes), humanBytes(t.FreeBytes), usedPct(t.TotalBytes, t.FreeBytes), health(t.Alive))
	}
	shared := st.TotalBytes != 0 && st.TotalBytes != total
	if shared {
		// Targets share a disk: the sum would count it several times.
		total, free = st.TotalBytes, st.FreeBytes
	}
	fmt.Fprintf(w, "total\t\t\t%s\t%s\t%s\t\n", humanBytes(total), humanBytes(free), usedPct(total, free))
	w.Flush()
	if shared {
		fmt.Fprintln(out, "(targets on one file system of one host are counted once in the total, as df shows it)")
	}
	fmt.Fprintln(out)
	printClients(out, st, showLocks)
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
	switch {
	case st.LockGrace:
		fmt.Fprintf(out, "locks: %d held; grace period after a metadata restart: new locks wait until %d client(s) have reclaimed theirs\n", st.LocksTotal, st.LockGracePending)
	default:
		fmt.Fprintf(out, "locks: %d held\n", st.LocksTotal)
	}
	if !showLocks {
		if st.LocksTotal > 0 {
			fmt.Fprintln(out, "(`strata status --locks` lists them)")
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

func usedPct(total, free uint64) string {
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(total-free)/float64(total))
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
