package history

import (
	"errors"
	"fmt"
	"slices"
)

// ExactlyOnce checks, for every content name (a partition of its own)
// with a Final read-back, that the name exists at the end exactly when the
// creates and unlinks applied say so: each applied create turns the name
// from absent to present and each applied unlink back, so
//
//	creates applied − unlinks applied = 1 if present at the end, else 0,
//
// with the acknowledged ones applied, EEXIST and ENOENT answers not
// applied, and the Unknown ones either. A create acknowledged twice
// without an unlink between, a lost acknowledged create and an unlink
// applied twice all break it.
func ExactlyOnce(ops []Op) error {
	type tally struct{ okC, unkC, okU, unkU int }
	tallies := map[string]*tally{}
	final := map[string]Op{}
	for _, op := range ops {
		if op.In.Part != op.In.Name {
			continue // a rename directory's name: the linearizability check covers it
		}
		if op.Final {
			final[op.In.Name] = op
			continue
		}
		t := tallies[op.In.Name]
		if t == nil {
			t = &tally{}
			tallies[op.In.Name] = t
		}
		switch {
		case op.In.Kind == Create && op.Out.Status == OK:
			t.okC++
		case op.In.Kind == Create && op.Out.Status == Unknown:
			t.unkC++
		case op.In.Kind == Unlink && op.Out.Status == OK:
			t.okU++
		case op.In.Kind == Unlink && op.Out.Status == Unknown:
			t.unkU++
		}
	}
	names := make([]string, 0, len(final))
	for n := range final {
		names = append(names, n)
	}
	slices.Sort(names)
	var errs []error
	for _, n := range names {
		f := final[n]
		var present int
		switch f.Out.Status {
		case OK:
			present = 1
		case NotFound:
		default:
			errs = append(errs, fmt.Errorf("%s: final read-back %v: cannot tell whether it exists", n, f.Out))
			continue
		}
		t := tallies[n]
		if t == nil {
			t = &tally{}
		}
		lo, hi := t.okC-t.okU-t.unkU, t.okC+t.unkC-t.okU
		if present < lo || present > hi {
			errs = append(errs, fmt.Errorf("%s: exists=%v at the end, but %d creates acknowledged (%d unknown) and %d unlinks acknowledged (%d unknown): creates applied − unlinks applied lies in [%d, %d]",
				n, present == 1, t.okC, t.unkC, t.okU, t.unkU, lo, hi))
		}
	}
	return errors.Join(errs...)
}
