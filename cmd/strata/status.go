package main

import (
	"encoding/json"
	"fmt"
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
}

func (a *adminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.meta, "meta", "", "metadata service address (default $STRATA_META or the local cluster's)")
	cmd.Flags().StringVar(&a.keyFile, "key-file", "", "cluster key file (default $STRATA_KEY_FILE or the local cluster's)")
	cmd.Flags().StringVar(&a.data, "data", "./strata-data", "data directory of a local cluster started by `strata up`")
}

// upInfo is what `strata up` records in DATA/cluster.json.
type upInfo struct {
	Meta    string `json:"meta"`
	KeyFile string `json:"key_file"`
	Mount   string `json:"mount"`
	Pid     int    `json:"pid"`
}

func (a *adminFlags) dial() (*rpc.Client, error) {
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
		return nil, usagef("no metadata service address: pass --meta ADDR, set STRATA_META, or run from the directory holding strata-data/")
	}
	key, err := readKeyFile(keyFile)
	if err != nil {
		return nil, err
	}
	return rpc.NewClient(meta, rpc.ClientConfig{Key: key, Conns: 1, DialTimeout: 3 * time.Second, CallTimeout: 10 * time.Second}), nil
}

func init() {
	var af adminFlags
	var asJSON bool
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
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printStatus(&st)
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rootCmd.AddCommand(cmd)
}

func printStatus(st *rpc.ClusterStatusResp) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "metadata\t%s\traft %s, term %d, commit %d, applied %d, durable %d\tinodes %d, sessions %d\n",
		st.MetaAddr, st.RaftState, st.Term, st.CommitIndex, st.AppliedIndex, st.DurableIndex, st.Inodes, st.Sessions)
	w.Flush()
	fmt.Println()
	fmt.Fprintln(w, "SERVER\tADDRESS\tHOST\tHEALTH\tLAST SEEN")
	for _, s := range st.Servers {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s ago\n", s.ID, s.Addr, s.Host, health(s.Alive), time.Duration(s.LastSeenMs)*time.Millisecond)
	}
	w.Flush()
	fmt.Println()
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
		fmt.Println("(targets on one file system of one host are counted once in the total, as df shows it)")
	}
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
