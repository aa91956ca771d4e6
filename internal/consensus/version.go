package consensus

// WALVersion is the version of the Raft log's segment format (wal.go).
const WALVersion = walVersion
