package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/stratafs/strata/internal/admin"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/mountinfo"
	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/transport"
)

func init() {
	stripe := &cobra.Command{
		Use:   "stripe",
		Short: "Show or set how files are striped over targets",
	}
	var count int
	var size string
	var mirror bool
	set := &cobra.Command{
		Use:   "set [--count N] [--size S] [--mirror] DIR",
		Short: "Set a directory's default layout for new files (0 = system default); --mirror puts them on mirror groups",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("count") && !cmd.Flags().Changed("size") && !cmd.Flags().Changed("mirror") {
				return usagef("stripe set: give --count, --size and/or --mirror")
			}
			if count < 0 {
				return usagef("--count %d: must be ≥ 0", count)
			}
			if count > layout.MaxStripeCount {
				return usagef("--count %d: a file spans at most %d targets", count, layout.MaxStripeCount)
			}
			sz, err := parseSize(size)
			if err != nil {
				return usagef("--size %q: %v", size, err)
			}
			if cmd.Flags().Changed("size") && sz != 0 && (sz < layout.MinStripeSize || sz > layout.MaxStripeSize || sz%layout.MinStripeSize != 0) {
				return usagef("--size %s: a stripe size is a multiple of %s from %s to %s (0: the default, %s)", size,
					humanBytes(layout.MinStripeSize), humanBytes(layout.MinStripeSize), humanBytes(layout.MaxStripeSize), humanBytes(layout.DefaultStripeSize))
			}
			dir := args[0]
			if err := requireStrata(dir); err != nil {
				return err
			}
			cur, err := getLayout(dir)
			if err != nil {
				return err
			}
			var countp, sizep *uint32
			if cmd.Flags().Changed("count") {
				c := uint32(count)
				countp = &c
			}
			if cmd.Flags().Changed("size") {
				s := uint32(sz)
				sizep = &s
			}
			if cmd.Flags().Changed("mirror") {
				return setDirMirror(cmd.Context(), dir, cur, countp, sizep, mirror)
			}
			val := admin.SetValue(cur, countp, sizep)
			if err := unix.Setxattr(dir, admin.LayoutXattr, []byte(val), 0); err != nil {
				if errors.Is(err, unix.EINVAL) && count > 0 {
					// Size and count passed the checks above: what the
					// metadata service refuses is a count over its targets.
					return fmt.Errorf("set layout of %s: --count %d is more than the targets registered with the metadata service (strata status lists them)", args[0], count)
				}
				return explainXattr("set layout of", args[0], err)
			}
			return nil
		},
	}
	set.Flags().IntVar(&count, "count", 0, "stripe count: number of targets each new file spans (0 = all, capped at 8; not given: keep the directory's)")
	set.Flags().StringVar(&size, "size", "0", "stripe size, e.g. 1M, 4M, 65536 (0 = 1 MiB; not given: keep the directory's)")
	set.Flags().BoolVar(&mirror, "mirror", false, "new files under DIR (and its new subdirectories) go on mirror groups (strata mirror create makes them); --mirror=false: on targets again")
	var asJSON bool
	get := &cobra.Command{
		Use:   "get [--json] PATH",
		Short: "Show a file's layout (stripe size, count, targets) or a directory's default",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireStrata(args[0]); err != nil {
				return err
			}
			l, err := getLayout(args[0])
			if err != nil {
				return err
			}
			mirror, mirrorErr := dirMirrorMark(cmd.Context(), args[0])
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(struct {
					admin.Layout
					Mirror *bool `json:"mirror,omitempty"`
				}{l, mirror})
			}
			countText := strconv.Itoa(int(l.StripeCount))
			if l.StripeCount == 0 {
				countText = "default (all targets, at most 8)"
			}
			sizeText := humanBytes(uint64(l.StripeSize))
			if l.StripeSize == 0 {
				sizeText = "default (1 MiB)"
			}
			fmt.Printf("stripe_size:  %s\nstripe_count: %s\n", sizeText, countText)
			if len(l.Targets) > 0 {
				ids := make([]string, len(l.Targets))
				what := "targets:     "
				for i, t := range l.Targets {
					if layout.IsGroup(t) { // a mirrored file: all are groups
						what = "mirror groups:"
						t &^= layout.GroupBit
					}
					ids[i] = strconv.Itoa(int(t))
				}
				fmt.Printf("%s %s\n", what, strings.Join(ids, " "))
			}
			if l.MaxFileBytes > 0 {
				fmt.Printf("max_file_size: %s (%d bytes)\n", humanBytes(uint64(l.MaxFileBytes)), l.MaxFileBytes)
			}
			switch {
			case mirror != nil && *mirror:
				fmt.Printf("mirror:       on (new files go on mirror groups)\n")
			case mirror != nil:
				fmt.Printf("mirror:       off\n")
			case mirrorErr != nil:
				fmt.Printf("mirror:       unknown (%v)\n", mirrorErr)
			}
			return nil
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, `print {"stripe_size": …, "stripe_count": …, "targets": [ids], "max_file_bytes": … (files), "mirror": … (directories)}`)
	stripe.AddCommand(set, get)
	rootCmd.AddCommand(stripe)
}

// setDirMirror sets dir's mirror mark (and the count and size given) with
// one MSetDirLayout to the metadata service of the mount dir is on: the
// layout xattr of older mounts has no word for it.
func setDirMirror(ctx context.Context, dir string, cur admin.Layout, count, size *uint32, on bool) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("stripe set: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return usagef("stripe set --mirror: %s is not a directory", dir)
	}
	m, err := dirMetaClient(dir)
	if err != nil {
		return fmt.Errorf("stripe set --mirror: %w", err)
	}
	defer m.Close()
	req := &rpc.SetDirLayoutReq{Dir: st.Ino, StripeSize: cur.StripeSize, StripeCount: cur.StripeCount, Mirror: rpc.DirMirrorOff}
	if count != nil {
		req.StripeCount = *count
	}
	if size != nil {
		req.StripeSize = *size
	}
	if on {
		req.Mirror = rpc.DirMirrorOn
	}
	if err := m.Call(ctx, rpc.MSetDirLayout, req, &rpc.AttrResp{}); err != nil {
		return fmt.Errorf("set layout of %s: %w", dir, err)
	}
	return nil
}

// dirMetaClient is an admin client of the metadata service of the mount
// dir is on (it needs the cluster's key file).
func dirMetaClient(dir string) (*transport.Multi, error) {
	c, err := admin.Locate(admin.Query{Dir: dir})
	if err != nil {
		return nil, fmt.Errorf("find the cluster of %s: %w", dir, err)
	}
	key, err := readKeyFile(c.KeyFile)
	if err != nil {
		return nil, err
	}
	return adminMetaClient(strings.Join(c.MetaAddrs, ","), key), nil
}

// dirMirrorMark answers the mirror mark of path if it is a directory:
// nil and no error for anything else, nil and why when it cannot be
// read (no access to the key file, an older metadata service). The layout
// xattr has no word for the mark, so it comes from the metadata service.
func dirMirrorMark(ctx context.Context, path string) (*bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, nil
	}
	m, err := dirMetaClient(path)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var r rpc.DirLayoutResp
	if err := m.Call(ctx, rpc.MDirLayout, &rpc.GetAttrReq{Ino: st.Ino}, &r); err != nil {
		return nil, fmt.Errorf("ask the metadata service: %w", err)
	}
	return &r.Mirror, nil
}

// requireStrata refuses a path that is not on a Strata mount: a layout
// xattr set there would be an ordinary xattr that means nothing.
func requireStrata(path string) error {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return usagef("%s does not exist", path)
		}
		return err
	}
	_, ok, err := mountinfo.OnStrata(path)
	if err != nil {
		return err
	}
	if !ok {
		what := ""
		if mm, err := mountinfo.Containing(path); err == nil {
			what = fmt.Sprintf(" (it is on %s, file system type %s)", mm.Point, mm.FSType)
		}
		return usagef("%s is not on a Strata mount%s: layouts exist only there", path, what)
	}
	return nil
}

// getLayout reads path's layout through the virtual xattr.
func getLayout(path string) (admin.Layout, error) {
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(path, admin.LayoutXattr, buf)
	if err != nil {
		return admin.Layout{}, explainXattr("get layout of", path, err)
	}
	l, err := admin.ParseLayout(buf[:n])
	if err != nil {
		return admin.Layout{}, fmt.Errorf("layout of %s: %w", path, err)
	}
	return l, nil
}

func explainXattr(what, path string, err error) error {
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, syscall.ENOTSUP):
		return fmt.Errorf("%s %s: not on a Strata mount", what, path)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("%s %s: permission denied (you need write permission on it)", what, path)
	}
	return fmt.Errorf("%s %s: %w", what, path, err)
}

// parseSize reads sizes like 4M, 4MiB, 64k, 1G, 2T or plain bytes (binary units).
func parseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	mult := uint64(1)
	up := strings.ToUpper(s)
	for _, suf := range []struct {
		s string
		m uint64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}} {
		if strings.HasSuffix(up, suf.s) {
			mult = suf.m
			up = strings.TrimSuffix(up, suf.s)
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(up), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a size (want e.g. 1M, 4MiB, 65536)")
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("too large")
	}
	return n * mult, nil
}
