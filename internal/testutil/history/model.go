package history

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Kind is what an operation does.
type Kind uint8

const (
	Create   Kind = iota + 1 // open(O_CREAT|O_EXCL), fstat, close: OK(ino) or Exists
	Unlink                   // OK or NotFound
	Rename                   // Name → To (replacing To): OK or NotFound
	Write                    // open(O_WRONLY), pwrite(Value, 0), [fsync], close: OK or NotFound
	Truncate                 // open(O_WRONLY|O_TRUNC), close: OK or NotFound
	Read                     // open, fstat, pread, close: OK(ino, Value) or NotFound
	Stat                     // lstat: OK(ino, Size) or NotFound
)

var kindNames = [...]string{Create: "create", Unlink: "unlink", Rename: "rename", Write: "write", Truncate: "truncate", Read: "read", Stat: "stat"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind%d", uint8(k))
}

// Status is the outcome class of an operation.
type Status uint8

const (
	// Unknown: the operation failed in a way that does not prove it did
	// not happen, or was still running when recording stopped.
	Unknown  Status = iota
	OK              // it happened
	Exists          // EEXIST: nothing happened
	NotFound        // ENOENT: nothing happened
)

var statusNames = [...]string{Unknown: "unknown", OK: "ok", Exists: "EEXIST", NotFound: "ENOENT"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status%d", uint8(s))
}

// Input is what an operation asked.
type Input struct {
	Kind Kind
	// Part is the partition: the name itself for content names, the
	// directory for rename names (a rename stays within its directory).
	Part  string
	Name  string // relative to the recorded root, e.g. "c/f3"
	To    string // Rename: the new name
	Value string // Write: the bytes written at offset 0
}

// Output is what came back.
type Output struct {
	Status Status
	Ino    uint64 // Create, Read, Stat with OK; 0: not known
	Size   int64  // Stat with OK
	Value  string // Read with OK
	Err    string // the error of an Unknown outcome, for the report
}

func (in Input) String() string {
	switch in.Kind {
	case Rename:
		return fmt.Sprintf("rename(%s, %s)", in.Name, in.To)
	case Write:
		return fmt.Sprintf("write(%s, %q)", in.Name, in.Value)
	}
	return fmt.Sprintf("%v(%s)", in.Kind, in.Name)
}

func (o Output) String() string {
	switch {
	case o.Status == Unknown:
		return "unknown: " + o.Err
	case o.Status != OK:
		return o.Status.String()
	case o.Value != "":
		return fmt.Sprintf("ok ino=%d %q", o.Ino, o.Value)
	case o.Ino != 0:
		return fmt.Sprintf("ok ino=%d size=%d", o.Ino, o.Size)
	}
	return "ok"
}

// file is one existing name in the model.
type file struct {
	ino     uint64 // 0: created with an unknown outcome, not yet seen
	content string
}

// state is a partition's model state, encoded as a string so that
// porcupine's == comparison and a hash serve: sorted "name\x00ino\x00
// content\x01" records. Step never mutates a state; it decodes, changes
// the copy and encodes.
type state = string

func decode(s state) map[string]file {
	m := map[string]file{}
	for rec := range strings.SplitSeq(s, "\x01") {
		if rec == "" {
			continue
		}
		parts := strings.SplitN(rec, "\x00", 3)
		ino, _ := strconv.ParseUint(parts[1], 10, 64)
		m[parts[0]] = file{ino: ino, content: parts[2]}
	}
	return m
}

func encode(m map[string]file) state {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s\x00%d\x00%s\x01", n, m[n].ino, m[n].content)
	}
	return b.String()
}

// pwrite0 is content after writing v at offset 0 (no truncation).
func pwrite0(content, v string) string {
	if len(v) >= len(content) {
		return v
	}
	return v + content[len(v):]
}

// step is the sequential specification of one partition.
func step(st, inAny, outAny any) (bool, any) {
	in, out := inAny.(Input), outAny.(Output)
	unknown := out.Status == Unknown
	m := decode(st.(state))
	f, exists := m[in.Name]
	// sameIno: a definite answer naming an inode agrees with the model,
	// binding a file created with an unknown outcome to it.
	sameIno := func() bool {
		if out.Ino == 0 || f.ino == out.Ino {
			return true
		}
		if f.ino == 0 {
			f.ino = out.Ino
			m[in.Name] = f
			return true
		}
		return false
	}
	switch in.Kind {
	case Create:
		if exists {
			return unknown || out.Status == Exists, st
		}
		if !unknown && out.Status != OK {
			return false, st
		}
		m[in.Name] = file{ino: out.Ino}
	case Unlink, Rename, Write, Truncate:
		if !exists {
			return unknown || out.Status == NotFound, st
		}
		if !unknown && out.Status != OK {
			return false, st
		}
		switch in.Kind {
		case Unlink:
			delete(m, in.Name)
		case Rename:
			delete(m, in.Name)
			m[in.To] = f
		case Write:
			f.content = pwrite0(f.content, in.Value)
			m[in.Name] = f
		case Truncate:
			f.content = ""
			m[in.Name] = f
		}
	case Read, Stat:
		switch {
		case unknown:
			return true, st
		case !exists:
			return out.Status == NotFound, st
		case out.Status != OK:
			return false, st
		case in.Kind == Read && out.Value != f.content:
			return false, st
		case in.Kind == Stat && out.Size != int64(len(f.content)):
			return false, st
		case !sameIno():
			return false, st
		}
	default:
		return false, st
	}
	return true, encode(m)
}

// Model is the porcupine model of the recorded names, partitioned by
// Input.Part.
func Model() porcupine.Model {
	return porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			byPart := map[string][]porcupine.Operation{}
			var order []string
			for _, op := range h {
				p := op.Input.(Input).Part
				if _, ok := byPart[p]; !ok {
					order = append(order, p)
				}
				byPart[p] = append(byPart[p], op)
			}
			out := make([][]porcupine.Operation, 0, len(order))
			for _, p := range order {
				out = append(out, byPart[p])
			}
			return out
		},
		Init: func() any { return state("") },
		Step: step,
		Hash: func(s any) uint64 {
			h := fnv.New64a()
			h.Write([]byte(s.(state)))
			return h.Sum64()
		},
		DescribeOperation: func(in, out any) string {
			return fmt.Sprintf("%v → %v", in.(Input), out.(Output))
		},
		DescribeState: func(s any) string {
			m := decode(s.(state))
			names := make([]string, 0, len(m))
			for n := range m {
				names = append(names, n)
			}
			slices.Sort(names)
			parts := make([]string, 0, len(names))
			for _, n := range names {
				parts = append(parts, fmt.Sprintf("%s(ino %d)=%q", n, m[n].ino, m[n].content))
			}
			return "{" + strings.Join(parts, ", ") + "}"
		},
	}
}
