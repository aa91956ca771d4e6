package history

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// op builds a synthetic operation on content name n.
func op(client int, k Kind, n string, call, ret int64, out Output) Op {
	return Op{Client: client, In: Input{Kind: k, Part: n, Name: n}, Out: out, Call: call, Return: ret}
}

func write(client int, n, v string, call, ret int64, st Status) Op {
	o := op(client, Write, n, call, ret, Output{Status: st})
	o.In.Value = v
	return o
}

var (
	ok       = Output{Status: OK}
	exists   = Output{Status: Exists}
	notFound = Output{Status: NotFound}
	unknown  = Output{Status: Unknown, Err: "EIO"}
)

func read(v string) Output { return Output{Status: OK, Value: v} }

func final(o Op) Op { o.Final = true; return o }

func expectLinearizable(t *testing.T, ops []Op) {
	t.Helper()
	if err := Check(ops, t.Name()); err != nil {
		t.Fatal(err)
	}
	if err := ExactlyOnce(ops); err != nil {
		t.Fatal(err)
	}
}

func expectIllegal(t *testing.T, ops []Op) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("STRATA_HISTORY_DIR", dir)
	err := Check(ops, t.Name())
	if !errors.Is(err, ErrNotLinearizable) {
		t.Fatalf("check: %v, want not linearizable", err)
	}
	i := strings.Index(err.Error(), dir)
	if i < 0 {
		t.Fatalf("error %q does not name the visualisation under %s", err, dir)
	}
	path := strings.Fields(err.Error()[i:])[0]
	path = strings.TrimRight(path, ":")
	if b, rerr := os.ReadFile(path); rerr != nil || !strings.Contains(string(b), "<html") {
		t.Fatalf("visualisation %s: %v (%d bytes)", path, rerr, len(b))
	}
}

func TestLinearizableHistoriesPass(t *testing.T) {
	const f = "c/f0"
	t.Run("concurrent", func(t *testing.T) {
		expectLinearizable(t, []Op{
			op(0, Create, f, 0, 10, ok),
			write(0, f, "aaaa", 20, 40, OK),
			// concurrent with the write: either value is right
			op(1, Read, f, 25, 35, read("")),
			op(2, Read, f, 30, 50, read("aaaa")),
			write(1, f, "bb", 60, 70, OK),
			op(2, Read, f, 80, 90, read("bbaa")),
			op(1, Stat, f, 80, 90, Output{Status: OK, Size: 4}),
			op(0, Create, f, 95, 99, exists),
			op(0, Unlink, f, 100, 110, ok),
			op(1, Unlink, f, 105, 115, notFound),
			final(op(3, Read, f, 200, 210, notFound)),
		})
	})
	t.Run("unknown outcomes", func(t *testing.T) {
		// A create whose outcome is unknown, seen to have happened; an
		// unlink whose outcome is unknown, that did not happen.
		expectLinearizable(t, []Op{
			op(0, Create, f, 0, 10, unknown),
			op(1, Read, f, 20, 30, Output{Status: OK, Ino: 7}),
			op(1, Stat, f, 40, 50, Output{Status: OK, Ino: 7}),
			op(0, Unlink, f, 60, -1, unknown), // never returned
			final(op(3, Read, f, 200, 210, Output{Status: OK, Ino: 7})),
		})
	})
	t.Run("rename", func(t *testing.T) {
		r := func(c int, k Kind, n, to string, call, ret int64, out Output) Op {
			return Op{Client: c, In: Input{Kind: k, Part: "r", Name: n, To: to}, Call: call, Return: ret, Out: out}
		}
		expectLinearizable(t, []Op{
			r(0, Create, "r/a", "", 0, 10, Output{Status: OK, Ino: 5}),
			r(0, Create, "r/b", "", 0, 10, Output{Status: OK, Ino: 6}),
			r(1, Rename, "r/a", "r/b", 20, 30, ok),
			r(2, Stat, "r/b", "", 40, 50, Output{Status: OK, Ino: 5}),
			r(2, Stat, "r/a", "", 40, 50, notFound),
			r(1, Rename, "r/a", "r/b", 60, 70, notFound),
		})
	})
}

// The checker can fail: each history breaks linearizability in one way.
func TestNonLinearizableHistoriesFail(t *testing.T) {
	const f = "c/f0"
	t.Run("read before its write began", func(t *testing.T) {
		expectIllegal(t, []Op{
			op(0, Create, f, 0, 10, ok),
			op(1, Read, f, 20, 30, read("aaaa")),
			write(0, f, "aaaa", 40, 50, OK),
		})
	})
	t.Run("create acknowledged twice", func(t *testing.T) {
		ops := []Op{
			op(0, Create, f, 0, 10, ok),
			op(1, Create, f, 20, 30, ok),
			final(op(3, Read, f, 40, 50, read(""))),
		}
		expectIllegal(t, ops)
		if err := ExactlyOnce(ops); err == nil {
			t.Error("exactly-once passed a create acknowledged twice")
		}
	})
	t.Run("lost acknowledged create", func(t *testing.T) {
		ops := []Op{
			op(0, Create, f, 0, 10, ok),
			op(1, Stat, f, 20, 30, notFound),
			final(op(3, Read, f, 40, 50, notFound)),
		}
		expectIllegal(t, ops)
		if err := ExactlyOnce(ops); err == nil {
			t.Error("exactly-once passed a lost create")
		}
	})
	t.Run("rename undone", func(t *testing.T) {
		r := func(c int, k Kind, n, to string, call, ret int64, out Output) Op {
			return Op{Client: c, In: Input{Kind: k, Part: "r", Name: n, To: to}, Call: call, Return: ret, Out: out}
		}
		expectIllegal(t, []Op{
			r(0, Create, "r/a", "", 0, 10, Output{Status: OK, Ino: 5}),
			r(1, Rename, "r/a", "r/b", 20, 30, ok),
			r(2, Stat, "r/a", "", 40, 50, Output{Status: OK, Ino: 5}),
		})
	})
	t.Run("unknown create seen as two files", func(t *testing.T) {
		// An unknown create may have happened, but only once: a file
		// seen with two inode numbers is two files.
		expectIllegal(t, []Op{
			op(0, Create, f, 0, 10, unknown),
			op(1, Stat, f, 20, 30, Output{Status: OK, Ino: 7}),
			op(1, Stat, f, 40, 50, Output{Status: OK, Ino: 8}),
		})
	})
}

// ExactlyOnce with unknown outcomes: an unknown create may or may not
// have happened; an acknowledged unlink of a name present at the end,
// without a later create, is a duplicate resurrection.
func TestExactlyOnceBounds(t *testing.T) {
	const f = "c/f0"
	if err := ExactlyOnce([]Op{op(0, Create, f, 0, 10, unknown), final(op(1, Read, f, 20, 30, read("")))}); err != nil {
		t.Errorf("unknown create, present: %v", err)
	}
	if err := ExactlyOnce([]Op{op(0, Create, f, 0, 10, unknown), final(op(1, Read, f, 20, 30, notFound))}); err != nil {
		t.Errorf("unknown create, absent: %v", err)
	}
	if err := ExactlyOnce([]Op{op(0, Create, f, 0, 10, ok), op(0, Unlink, f, 20, 30, ok), final(op(1, Read, f, 40, 50, read("")))}); err == nil {
		t.Error("a name acknowledged created and unlinked but present passed")
	}
	if err := ExactlyOnce([]Op{op(0, Create, f, 0, 10, ok), final(op(1, Read, f, 40, 50, unknown))}); err == nil {
		t.Error("an unknown final read-back passed")
	}
}

// Run on a local directory (the kernel's file system is linearizable for
// one process): the history checks, and every recorder did something.
func TestRunOnLocalDirectory(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	h, err := Run(Config{Root: t.TempDir(), Seed: seed, Duration: 500 * time.Millisecond, MaxOps: 2000})
	if err != nil {
		t.Fatal(err)
	}
	ops := h.Ops()
	c := Counts(ops)
	t.Logf("%d operations: %v", len(ops), c)
	if c[Unknown] != 0 || c[OK] < 100 || c[Exists] == 0 || c[NotFound] == 0 {
		t.Fatalf("outcomes %v: want no unknown and some of each other", c)
	}
	if err := Check(ops, t.Name()); err != nil {
		t.Fatal(err)
	}
	if err := ExactlyOnce(ops); err != nil {
		t.Fatal(err)
	}
}
