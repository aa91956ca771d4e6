package consensus

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
)

// ErrNotSingleVoter: RebindSingleVoter found a configuration with other
// servers than the one voter it can rebind.
var ErrNotSingleVoter = errors.New("consensus: the stored raft configuration has more than one server")

// latestConfiguration is the newest configuration in the log (or else in
// the newest snapshot): what a node opened on w and snaps starts with (ok
// false: none, a fresh node).
func latestConfiguration(w *wal, snaps raft.SnapshotStore) (conf raft.Configuration, ok bool, err error) {
	first, _ := w.FirstIndex()
	last, _ := w.LastIndex()
	for i := last; i >= first && i > 0; i-- {
		var l raft.Log
		if err := w.GetLog(i, &l); err != nil {
			return conf, false, fmt.Errorf("read raft log entry %d: %w", i, err)
		}
		if l.Type == raft.LogConfiguration {
			return raft.DecodeConfiguration(l.Data), true, nil
		}
	}
	list, err := snaps.List()
	if err != nil {
		return conf, false, fmt.Errorf("list raft snapshots: %w", err)
	}
	if len(list) > 0 {
		return list[0].Configuration, true, nil
	}
	return conf, false, nil
}

// RebindSingleVoter gives the raft state in dir (Config.Dir) of a node
// that is the only server of its configuration a new raft id and address:
// it appends a configuration entry naming id at addr alone, in the term
// of the last entry, as that node would have as leader. With no other
// server there is nobody whose log or vote it could contradict; the node,
// opened with the new id, elects itself and commits the entry. It returns
// the id it had ("" and nil when it already had id at addr, or dir holds
// no raft state), or ErrNotSingleVoter (nothing written). The node must
// not be running.
func RebindSingleVoter(dir, id, addr string, lg *slog.Logger) (old string, err error) {
	if _, err := os.Stat(filepath.Join(dir, "wal")); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	logs, err := openLogStore(filepath.Join(dir, "log"))
	if err != nil {
		return "", err
	}
	defer logs.Close()
	w, err := openWAL(filepath.Join(dir, "wal"), DefaultSegmentBytes, lg)
	if err != nil {
		return "", err
	}
	defer w.Close()
	if err := migrateLog(logs, w); err != nil {
		return "", err
	}
	snaps, err := raft.NewFileSnapshotStore(dir, 2, &logWriter{log: lg})
	if err != nil {
		return "", fmt.Errorf("raft snapshot store: %w", err)
	}
	conf, ok, err := latestConfiguration(w, snaps)
	if err != nil || !ok {
		return "", err
	}
	if len(conf.Servers) != 1 || conf.Servers[0].Suffrage != raft.Voter {
		var ids []string
		for _, s := range conf.Servers {
			ids = append(ids, string(s.ID)+"@"+string(s.Address))
		}
		return "", fmt.Errorf("%w: %v", ErrNotSingleVoter, ids)
	}
	me := conf.Servers[0]
	if string(me.ID) == id && string(me.Address) == addr {
		return "", nil
	}
	var index, term uint64
	if last, _ := w.LastIndex(); last > 0 {
		var l raft.Log
		if err := w.GetLog(last, &l); err != nil {
			return "", fmt.Errorf("read raft log entry %d: %w", last, err)
		}
		index, term = last, l.Term
	} else if list, err := snaps.List(); err != nil || len(list) == 0 {
		return "", fmt.Errorf("raft state without a log or a snapshot: %v", err)
	} else {
		index, term = list[0].Index, list[0].Term
	}
	next := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(addr)}}}
	entry := &raft.Log{Index: index + 1, Term: term, Type: raft.LogConfiguration, Data: raft.EncodeConfiguration(next)}
	if err := w.StoreLogs([]*raft.Log{entry}); err != nil {
		return "", fmt.Errorf("append the new raft configuration: %w", err)
	}
	lg.Info("raft voter renamed", "from", me.ID, "from_addr", me.Address, "to", id, "index", entry.Index, "term", term)
	return string(me.ID), nil
}
