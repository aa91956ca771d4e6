//go:build race

package meta

// raceEnabled: the race detector slows the state machine ~10x; the
// million-entry directory test then uses fewer entries.
const raceEnabled = true
