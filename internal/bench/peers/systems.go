package peers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stratafs/strata/internal/bench"
)

// system is one file system under test. setup returns the directory to
// benchmark; teardown must undo whatever setup did, even a partial setup,
// and is safe to call twice.
type system interface {
	name() string
	setup(ctx context.Context) (string, error)
	teardown() error
}

// configurer is a system that adjusts the suite run on it (striping and
// cache hooks of Strata).
type configurer interface {
	configure(c *bench.Config)
}

// env is what every system needs.
type env struct {
	dir  string // work directory of this peers run
	self string // the strata binary
	logf func(string, ...any)
	pkgs *installer
	// upFlags are extra flags for strata up.
	upFlags []string
}

func (e *env) logPath(name string) string { return filepath.Join(e.dir, "logs", name+".log") }

func chownMFS(paths ...string) error {
	for _, p := range paths {
		if _, err := run(context.Background(), 30*time.Second, "chown", "-R", "mfs:mfs", p); err != nil {
			return err
		}
	}
	return nil
}

// ---- local directory ----

type localFS struct{ env *env }

func (s *localFS) name() string { return "local" }
func (s *localFS) setup(ctx context.Context) (string, error) {
	d := filepath.Join(s.env.dir, "local")
	return d, os.MkdirAll(d, 0o755)
}
func (s *localFS) teardown() error { return nil }

// ---- passthrough FUSE (strata passthrough) ----

type passthroughFS struct {
	env *env
	d   *daemon
	mnt string
}

func (s *passthroughFS) name() string { return "passthrough" }
func (s *passthroughFS) setup(ctx context.Context) (string, error) {
	src := filepath.Join(s.env.dir, "passthrough-src")
	s.mnt = filepath.Join(s.env.dir, "passthrough-mnt")
	for _, d := range []string{src, s.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	var err error
	if s.d, err = start("strata passthrough", s.env.logPath("passthrough"), s.env.self, "passthrough", src, s.mnt); err != nil {
		return "", err
	}
	return s.mnt, waitMount(ctx, s.mnt, "fuse.strata-passthrough", s.d, 30*time.Second)
}
func (s *passthroughFS) teardown() error {
	if s.mnt == "" {
		return nil
	}
	s.d.stop(20 * time.Second) // unmounts on SIGTERM
	err := unmount(s.mnt)
	s.mnt = ""
	return err
}

// ---- Strata local cluster (strata up) ----

// strataFS is `strata up` run by this binary in the foreground: metadata
// service, storage servers and FUSE mount in one process, data under
// strata-data. It is ready when its mount point shows in mountinfo with
// type fuse.strata and cluster.json (which `strata status --data` reads) is
// written. It stops on SIGTERM, unmounting itself; the teardown waits a
// bounded time, then kills it and unmounts lazily.
type strataFS struct {
	env *env
	// sys names a variant ("" = "strata"); flags are its own `strata up`
	// flags, before the run's --strata-up-flags. Its directories are
	// SYS-data and SYS-mnt.
	sys       string
	flags     []string
	d         *daemon
	data, mnt string
}

const (
	strataFSType    = "fuse.strata"
	strataStopGrace = 60 * time.Second
)

func (s *strataFS) name() string {
	if s.sys != "" {
		return s.sys
	}
	return "strata"
}

// upArgv is the command line of the cluster.
func upArgv(self, data, mnt string, extra ...string) []string {
	return append([]string{self, "up", "--data", data, "--mount", mnt}, extra...)
}

func (s *strataFS) setup(ctx context.Context) (string, error) {
	if out, err := exec.CommandContext(ctx, s.env.self, "up", "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "--mount") {
		return "", errSkip{"`strata up` is not available in this build"}
	} else {
		for _, f := range s.flags {
			if name, _, _ := strings.Cut(f, "="); strings.HasPrefix(f, "--") && !strings.Contains(string(out), name) {
				return "", errSkip{fmt.Sprintf("`strata up` of this build has no %s", f)}
			}
		}
	}
	s.data = filepath.Join(s.env.dir, s.name()+"-data")
	s.mnt = filepath.Join(s.env.dir, s.name()+"-mnt")
	for _, d := range []string{s.data, s.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	var err error
	flags := append(slices.Clone(s.flags), s.env.upFlags...)
	if s.d, err = start("strata up", s.env.logPath(s.name()+"-up"), upArgv(s.env.self, s.data, s.mnt, flags...)...); err != nil {
		return "", err
	}
	if err := waitMount(ctx, s.mnt, strataFSType, s.d, 90*time.Second); err != nil {
		return "", err
	}
	if t := mountFSType(s.mnt); t != strataFSType {
		return "", fmt.Errorf("%s mounted as %q, want %q", s.mnt, t, strataFSType)
	}
	if err := waitFile(ctx, filepath.Join(s.data, "cluster.json"), s.d, 30*time.Second); err != nil {
		return "", err
	}
	return s.mnt, nil
}

// configure points the striping hook at this cluster, so that the shared
// file's directory is striped over every live target `strata status`
// lists.
func (s *strataFS) configure(c *bench.Config) {
	c.Striper = bench.DefaultStriper{Binary: s.env.self, DataDir: s.data}
	c.Caches = bench.NoCaches{} // no server cache API yet; the page cache is dropped
}

func (s *strataFS) teardown() error {
	if s.mnt == "" {
		return nil
	}
	var errs []error
	if s.d.stop(strataStopGrace) {
		errs = append(errs, fmt.Errorf("strata up did not stop within %v of SIGTERM and was killed: %s", strataStopGrace, s.d.logTail()))
	}
	errs = append(errs, unmount(s.mnt))
	s.mnt = ""
	return errors.Join(errs...)
}

// errSkip marks a system that is not available (a note, not a failure).
type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

// ---- GlusterFS: one node, distribute volume over 2 bricks ----

const glusterVolume = "strata-bench"

// The Debian packages each peer needs, by their exact names.
var (
	glusterPackages = []string{"glusterfs-server", "glusterfs-client"}
	moosePackages   = []string{"moosefs-master", "moosefs-chunkserver", "moosefs-client"}
	// basePackages serve every peer: fio for the raw limit, fuse3 for
	// fusermount3 (unmounting FUSE file systems).
	basePackages = []string{"fio", "fuse3"}
)

type glusterFS struct {
	env              *env
	node             netNode
	glusterd, client *daemon
	mnt              string
	created          bool
}

func (s *glusterFS) name() string { return "glusterfs" }

func (s *glusterFS) cli(ctx context.Context, args ...string) (string, error) {
	argv := inNS(s.node.ns, append([]string{"gluster", "--mode=script"}, args...)...)
	return run(ctx, 2*time.Minute, argv[0], argv[1:]...)
}

func (s *glusterFS) setup(ctx context.Context) (string, error) {
	if err := s.env.pkgs.ensure(ctx, glusterPackages...); err != nil {
		return "", err
	}
	// A volume of ours left by a crashed run.
	os.RemoveAll("/var/lib/glusterd/vols/" + glusterVolume)
	var err error
	if s.node, err = addNode(ctx, "gluster", 10); err != nil {
		return "", err
	}
	base := filepath.Join(s.env.dir, "gluster")
	s.mnt = filepath.Join(base, "mnt")
	for _, d := range []string{base + "/brick1", base + "/brick2", s.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	if s.glusterd, err = start("glusterd", s.env.logPath("glusterd"), inNS(s.node.ns, "glusterd", "-N", "--log-file="+s.env.logPath("glusterd-own"))...); err != nil {
		return "", err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err = s.cli(ctx, "volume", "list"); err == nil {
			break
		}
		if time.Now().After(deadline) || s.glusterd.exited() {
			return "", fmt.Errorf("glusterd did not come up: %v %s", err, s.glusterd.logTail())
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.created = true
	if _, err := s.cli(ctx, "volume", "create", glusterVolume, "transport", "tcp",
		s.node.addr+":"+base+"/brick1", s.node.addr+":"+base+"/brick2", "force"); err != nil {
		return "", err
	}
	if _, err := s.cli(ctx, "volume", "start", glusterVolume); err != nil {
		return "", err
	}
	if s.client, err = start("glusterfs client", s.env.logPath("glusterfs-client"), inNS(s.node.ns, "glusterfs", "-N",
		"--volfile-server="+s.node.addr, "--volfile-id="+glusterVolume, "--log-file="+s.env.logPath("glusterfs-client-own"), s.mnt)...); err != nil {
		return "", err
	}
	return s.mnt, waitMount(ctx, s.mnt, "fuse.glusterfs", s.client, 60*time.Second)
}

func (s *glusterFS) teardown() error {
	var errs []error
	if s.mnt != "" {
		errs = append(errs, unmount(s.mnt))
	}
	s.client.stop(10 * time.Second)
	ctx := context.Background()
	if s.created && s.glusterd != nil && !s.glusterd.exited() {
		s.cli(ctx, "volume", "stop", glusterVolume, "force")
		s.cli(ctx, "volume", "delete", glusterVolume)
		s.created = false
	}
	s.glusterd.stop(10 * time.Second)
	if s.node.ns != "" {
		errs = append(errs, killNamespace(ctx, s.node.ns))
		s.node.ns = ""
	}
	os.RemoveAll("/var/lib/glusterd/vols/" + glusterVolume)
	return errors.Join(errs...)
}

// ---- MooseFS: master + 2 chunkservers + mfsmount ----

type mooseFS struct {
	env     *env
	nodes   []netNode // master, cs1, cs2, client
	daemons []*daemon // in start order
	client  *daemon
	mnt     string
}

func (s *mooseFS) name() string { return "moosefs" }

func (s *mooseFS) setup(ctx context.Context) (string, error) {
	if err := s.env.pkgs.ensure(ctx, moosePackages...); err != nil {
		return "", err
	}
	base := filepath.Join(s.env.dir, "moosefs")
	s.mnt = filepath.Join(base, "mnt")
	if err := os.MkdirAll(s.mnt, 0o755); err != nil {
		return "", err
	}
	for i, n := range []string{"mfsmaster", "mfscs1", "mfscs2", "mfsclient"} {
		node, err := addNode(ctx, n, 1+i)
		if err != nil {
			return "", err
		}
		s.nodes = append(s.nodes, node)
	}
	master := s.nodes[0]

	// Master: its own data directory, exports and config.
	mdir := filepath.Join(base, "master")
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		return "", err
	}
	empty, err := os.ReadFile("/var/lib/mfs/metadata.mfs.empty")
	if err != nil {
		return "", fmt.Errorf("moosefs master: %w", err)
	}
	if err := os.WriteFile(filepath.Join(mdir, "metadata.mfs"), empty, 0o644); err != nil {
		return "", err
	}
	exports := filepath.Join(mdir, "mfsexports.cfg")
	topo := filepath.Join(mdir, "mfstopology.cfg")
	mcfg := filepath.Join(mdir, "mfsmaster.cfg")
	for path, content := range map[string]string{
		exports: "*\t/\trw,alldirs,admin,maproot=0:0\n*\t.\trw\n",
		topo:    "",
		mcfg: fmt.Sprintf("WORKING_USER = mfs\nWORKING_GROUP = mfs\nDATA_PATH = %s\nEXPORTS_FILENAME = %s\nTOPOLOGY_FILENAME = %s\n"+
			"MATOML_LISTEN_HOST = %s\nMATOCS_LISTEN_HOST = %s\nMATOCL_LISTEN_HOST = %s\n",
			mdir, exports, topo, master.addr, master.addr, master.addr),
	} {
		if err := writeFile(path, content); err != nil {
			return "", err
		}
	}
	if err := chownMFS(mdir); err != nil {
		return "", err
	}
	d, err := start("mfsmaster", s.env.logPath("mfsmaster"), inNS(master.ns, "mfsmaster", "-c", mcfg, "-f", "start")...)
	if err != nil {
		return "", err
	}
	s.daemons = append(s.daemons, d)

	// Two chunkservers, each with its own address and chunk directory.
	for i, node := range s.nodes[1:3] {
		cdir := filepath.Join(base, fmt.Sprintf("cs%d", i+1))
		chunks := filepath.Join(cdir, "chunks")
		if err := os.MkdirAll(chunks, 0o755); err != nil {
			return "", err
		}
		hdd := filepath.Join(cdir, "mfshdd.cfg")
		ccfg := filepath.Join(cdir, "mfschunkserver.cfg")
		if err := writeFile(hdd, chunks+"\n"); err != nil {
			return "", err
		}
		if err := writeFile(ccfg, fmt.Sprintf("WORKING_USER = mfs\nWORKING_GROUP = mfs\nDATA_PATH = %s\nHDD_CONF_FILENAME = %s\n"+
			"MASTER_HOST = %s\nBIND_HOST = %s\nCSSERV_LISTEN_HOST = %s\nHDD_LEAVE_SPACE_DEFAULT = 1GiB\n",
			cdir, hdd, master.addr, node.addr, node.addr)); err != nil {
			return "", err
		}
		if err := chownMFS(cdir); err != nil {
			return "", err
		}
		d, err := start(fmt.Sprintf("mfschunkserver %d", i+1), s.env.logPath(fmt.Sprintf("mfschunkserver%d", i+1)),
			inNS(node.ns, "mfschunkserver", "-c", ccfg, "-f", "start")...)
		if err != nil {
			return "", err
		}
		s.daemons = append(s.daemons, d)
	}

	// Chunkservers and clients need the master listening; the client needs
	// both chunkservers registered (or all data lands on one).
	if err := waitLog(ctx, s.daemons[0], "mfsmaster daemon initialized properly", 1, 60*time.Second); err != nil {
		return "", err
	}
	if err := waitLog(ctx, s.daemons[0], "chunkserver register end", 2, 60*time.Second); err != nil {
		return "", err
	}

	// The client in a namespace of its own, mounted in the host's mount
	// namespace. mfsmount exits when its first connection to the master
	// fails (seen once in a fresh namespace: "can't connect to mfsmaster");
	// a few tries before giving up.
	for attempt := 1; ; attempt++ {
		if s.client, err = start("mfsmount", s.env.logPath("mfsmount"), inNS(s.nodes[3].ns, "mfsmount", s.mnt, "-f", "-H", master.addr)...); err != nil {
			return "", err
		}
		err = waitMount(ctx, s.mnt, "fuse", s.client, 60*time.Second)
		if err == nil {
			break
		}
		if attempt == 3 || !s.client.exited() || ctx.Err() != nil {
			return "", err
		}
		s.env.logf("moosefs: mfsmount attempt %d failed, trying again: %v", attempt, err)
		time.Sleep(2 * time.Second)
	}
	// Writes need both chunkservers registered: probe until a file can be
	// written and read back, then give late registrations a moment.
	probe := filepath.Join(s.mnt, ".strata-probe")
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := run(ctx, 20*time.Second, "sh", "-c", "echo strata > "+probe+" && cat "+probe)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("moosefs not writable: %v", err)
		}
		time.Sleep(time.Second)
	}
	os.Remove(probe)
	time.Sleep(2 * time.Second)
	// No trash (deleted files would fill the disk) and one copy per chunk,
	// like the GlusterFS distribute volume and an unmirrored Strata.
	// The tools talk to the master themselves: run them in the client's namespace.
	for _, argv := range [][]string{{"mfssettrashtime", "-r", "0", s.mnt}, {"mfssetgoal", "-r", "1", s.mnt}} {
		argv = inNS(s.nodes[3].ns, argv...)
		if _, err := run(ctx, 30*time.Second, argv[0], argv[1:]...); err != nil {
			return "", err
		}
	}
	return s.mnt, nil
}

func (s *mooseFS) teardown() error {
	var errs []error
	if s.mnt != "" {
		errs = append(errs, unmount(s.mnt))
	}
	s.client.stop(10 * time.Second)
	// Chunkservers before the master.
	for i := len(s.daemons) - 1; i >= 0; i-- {
		s.daemons[i].stop(20 * time.Second)
	}
	s.daemons = nil
	for _, n := range s.nodes {
		errs = append(errs, killNamespace(context.Background(), n.ns))
	}
	s.nodes = nil
	return errors.Join(errs...)
}
