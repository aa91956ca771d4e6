package history

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config shapes a Run.
type Config struct {
	Root    string // directory to work in (a mount, or a directory on it)
	Workers int    // concurrent recorders; default 4
	// Seed draws every recorder's operations (recorder w uses the
	// stream (Seed, w)): the same seed replays the same choices.
	Seed     int64
	Duration time.Duration // how long recorders start new operations; default 3 s
	MaxOps   int           // per recorder; 0: until Duration
	// ContentNames and RenameNames are how many names of each kind;
	// defaults 4 and 3.
	ContentNames, RenameNames int
	// Stall bounds how long Run waits, after Duration, for operations
	// still running (a hung file system); default 60 s. Operations still
	// running then are Unknown and Run returns ErrStalled with the
	// history.
	Stall time.Duration
	// Kinds, if set, limits the operations drawn to these (to narrow down
	// a finding); the final read-back is done regardless.
	Kinds []Kind
	// Pause, if set, is called between a recorder's operations (tests use
	// it to let a fault land mid-run); it must be safe for concurrent use.
	// Not passed to a recorder process (Start).
	Pause func() `json:"-"`
}

// ErrStalled: some operations did not complete within Config.Stall.
var ErrStalled = errors.New("operations still running")

func (c *Config) defaults() {
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.Duration <= 0 {
		c.Duration = 3 * time.Second
	}
	if c.ContentNames <= 0 {
		c.ContentNames = 4
	}
	if c.RenameNames <= 0 {
		c.RenameNames = 3
	}
	if c.Stall <= 0 {
		c.Stall = 60 * time.Second
	}
}

const (
	contentDir = "c"
	renameDir  = "r"
	// valueLen is the length of every written value: a write replaces the
	// whole content of a file written before (see the package doc).
	valueLen = 16
)

// Run records cfg.Workers recorders doing random operations on cfg.Root
// and then (client cfg.Workers) a Final read-back of every name. cfg.Root's
// c/ and r/ are created and must start empty.
func Run(cfg Config) (*History, error) {
	cfg.defaults()
	for _, d := range []string{contentDir, renameDir} {
		if err := os.MkdirAll(filepath.Join(cfg.Root, d), 0o755); err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
	}
	h := New()
	var content, renamed []string
	for i := range cfg.ContentNames {
		content = append(content, fmt.Sprintf("%s/f%d", contentDir, i))
	}
	for i := range cfg.RenameNames {
		renamed = append(renamed, fmt.Sprintf("%s/r%d", renameDir, i))
	}
	deadline := time.Now().Add(cfg.Duration)
	var wg sync.WaitGroup
	var writes atomic.Uint64
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(w)))
			r := recorder{h: h, root: cfg.Root, client: w}
			for n := 0; cfg.MaxOps == 0 || n < cfg.MaxOps; n++ {
				if time.Now().After(deadline) {
					return
				}
				if cfg.Pause != nil {
					cfg.Pause()
				}
				r.random(rng, content, renamed, &writes, cfg.Kinds)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline) + cfg.Stall):
		return h, fmt.Errorf("history: %d recorders, %v after their deadline: %w", cfg.Workers, cfg.Stall, ErrStalled)
	}
	final := recorder{h: h, root: cfg.Root, client: cfg.Workers, final: true}
	for _, n := range content {
		final.do(Input{Kind: Read, Part: n, Name: n})
	}
	for _, n := range renamed {
		final.do(Input{Kind: Stat, Part: renameDir, Name: n})
	}
	return h, nil
}

// recorder is one client doing operations and recording them.
type recorder struct {
	h      *History
	root   string
	client int
	final  bool
}

// random does one operation drawn from rng: on a content name (7 in 10)
// create 3, unlink 2, write 3, truncate 1, read 3, stat 2 in 14; on a
// rename name create 2, unlink 1, rename 3, stat 2 in 8.
func (r *recorder) random(rng *rand.Rand, content, renamed []string, writes *atomic.Uint64, kinds []Kind) {
	for {
		in := draw(rng, content, renamed)
		if kinds != nil && !slices.Contains(kinds, in.Kind) {
			continue
		}
		if in.Kind == Write {
			in.Value = fmt.Sprintf("w%d-%0*d", r.client, valueLen-2-len(fmt.Sprint(r.client)), writes.Add(1))
		}
		r.do(in)
		return
	}
}

func draw(rng *rand.Rand, content, renamed []string) Input {
	if rng.IntN(10) < 7 {
		n := content[rng.IntN(len(content))]
		in := Input{Part: n, Name: n}
		switch x := rng.IntN(14); {
		case x < 3:
			in.Kind = Create
		case x < 5:
			in.Kind = Unlink
		case x < 8:
			in.Kind = Write
		case x < 9:
			in.Kind = Truncate
		case x < 12:
			in.Kind = Read
		default:
			in.Kind = Stat
		}
		return in
	}
	in := Input{Part: renameDir, Name: renamed[rng.IntN(len(renamed))]}
	switch x := rng.IntN(8); {
	case x < 2:
		in.Kind = Create
	case x < 3:
		in.Kind = Unlink
	case x < 6:
		in.Kind = Rename
		in.To = renamed[rng.IntN(len(renamed))]
	default:
		in.Kind = Stat
	}
	return in
}

// do runs in on the file system and records it.
func (r *recorder) do(in Input) Output {
	id := r.h.begin(r.client, in, r.final)
	out := r.exec(in)
	r.h.End(id, out)
	return out
}

// outcome classifies err: nil is OK; the errnos in definite (which prove
// nothing happened) are theirs; anything else is Unknown.
func outcome(err error, definite ...syscall.Errno) Output {
	if err == nil {
		return Output{Status: OK}
	}
	for _, e := range definite {
		if errors.Is(err, e) {
			switch e {
			case syscall.EEXIST:
				return Output{Status: Exists}
			case syscall.ENOENT:
				return Output{Status: NotFound}
			}
		}
	}
	return Output{Status: Unknown, Err: err.Error()}
}

func (r *recorder) exec(in Input) Output {
	path := filepath.Join(r.root, in.Name)
	switch in.Kind {
	case Create:
		fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return outcome(err, syscall.EEXIST)
		}
		out := Output{Status: OK, Ino: fdIno(fd)}
		unix.Close(fd) // the create happened whatever close says
		return out
	case Unlink:
		return outcome(unix.Unlink(path), syscall.ENOENT)
	case Rename:
		return outcome(unix.Rename(path, filepath.Join(r.root, in.To)), syscall.ENOENT)
	case Write, Truncate:
		flags := unix.O_WRONLY | unix.O_CLOEXEC
		if in.Kind == Truncate {
			flags |= unix.O_TRUNC
		}
		fd, err := unix.Open(path, flags, 0)
		if err != nil {
			return outcome(err, syscall.ENOENT)
		}
		if in.Kind == Write {
			n, err := unix.Pwrite(fd, []byte(in.Value), 0)
			if err == nil && n != len(in.Value) {
				err = fmt.Errorf("short write: %d of %d bytes", n, len(in.Value))
			}
			if err == nil && in.Value[len(in.Value)-1]%2 == 0 {
				err = unix.Fsync(fd) // some writes are fsynced, some only closed
			}
			if err != nil {
				unix.Close(fd)
				return outcome(err)
			}
		}
		return outcome(unix.Close(fd))
	case Read:
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return outcome(err, syscall.ENOENT)
		}
		defer unix.Close(fd)
		ino := fdIno(fd)
		buf := make([]byte, 4*valueLen)
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return outcome(err)
		}
		return Output{Status: OK, Ino: ino, Value: string(buf[:n])}
	case Stat:
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return outcome(err, syscall.ENOENT)
		}
		return Output{Status: OK, Ino: st.Ino, Size: st.Size}
	}
	return Output{Status: Unknown, Err: fmt.Sprintf("unknown operation %v", in.Kind)}
}

// fdIno is the inode number of an open file (0 when fstat fails: the
// model then takes any).
func fdIno(fd int) uint64 {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	return st.Ino
}
