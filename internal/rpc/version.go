package rpc

// WireVersion is the version of the wire protocol: the last byte of the
// handshake's magic. Peers of different wire versions refuse each other.
const WireVersion = 2
