package consensus

import "fmt"

// LogFault decides the fate of one file operation of the raft log: op is
// "write" (an append's write) or "sync" (an fdatasync of a segment), path
// the segment file. A non-nil error fails the operation as the file
// system would (EIO, ENOSPC), without doing it.
type LogFault func(op, path string) error

// SetLogFault installs f under the node's raft log (nil removes it): the
// seam through which tests make the log's disk fail.
func (n *Node) SetLogFault(f LogFault) {
	if f == nil {
		n.wal.fault.Store(nil)
		return
	}
	n.wal.fault.Store(&f)
}

// injected is the installed fault's verdict on op of path.
func (w *wal) injected(op, path string) error {
	f := w.fault.Load()
	if f == nil {
		return nil
	}
	if err := (*f)(op, path); err != nil {
		return fmt.Errorf("injected fault: %w", err)
	}
	return nil
}

// fdatasync syncs s, unless a fault says otherwise.
func (w *wal) fdatasync(s *segment) error {
	if err := w.injected("sync", s.path); err != nil {
		return err
	}
	return fdatasyncSegment(s)
}
