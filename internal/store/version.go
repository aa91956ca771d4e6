package store

// ChunkFormatVersion is the version of the chunk files' checksum sidecar
// format (see format.go), which a target reads and writes.
const ChunkFormatVersion = sumFormat
