package rpc

import (
	"bytes"
	"reflect"
	"testing"
)

func TestMessagesRoundTrip(t *testing.T) {
	msgs := []Message{
		&CreateReq{Hdr: ReqHeader{1, 2}, Parent: 1, Name: "a", Mode: 0o100644, SymlinkTarget: "x"},
		&ReadDirResp{Entries: []DirEntry{{Name: "a", Ino: 2, Mode: 0o40755, Attr: Attr{Ino: 2, Size: 9}}}, EOF: true},
		&RegisterServerReq{Addr: "a:1", Targets: []TargetReg{{UUID: "u", Path: "/p", TotalBytes: 5}}},
		&ClusterStatusResp{Servers: []ServerInfo{{ID: 1, Alive: true}}, Targets: []TargetInfo{{ID: 3}}},
		&ClusterStatusResp{Targets: []TargetInfo{{ID: 3}}, FreePendingFiles: 1, Unsynced: []TargetUnsynced{{Chunks: 1, Bytes: 3901, OldestMs: 1200}}},
		&LockReq{ClientID: 1, Ino: 2, End: ^uint64(0), Type: LockWrite, Wait: true},
		&WriteReq{Chunk: ChunkID{Target: 1, Ino: 2}, Off: 3, Sync: true, Data: []byte("hi")},
		&WriteReq{Chunk: ChunkID{Target: GroupBit | 5, Ino: 2, Epoch: 9}, Off: 3, Data: []byte("mirrored")},
		&ServerHeartbeatResp{Groups: []GroupInfo{{ID: 5, Epoch: 9, Primary: 1, Secondary: 2, State: GroupDegraded, PrimaryAddr: "a:1"}}, LeaseMs: 2000, FailoverTimeoutMs: 3000},
		&ServerHeartbeatResp{Groups: []GroupInfo{{ID: 5, Epoch: 9, Primary: 1, Secondary: 2, State: GroupDegraded, FullResync: true}}, LeaseMs: 2000},
		&ListGroupsResp{Groups: []GroupInfo{{ID: 1, Epoch: 2, Primary: 3, Secondary: 4}, {ID: 5, Epoch: 9, Primary: 1, Secondary: 2, State: GroupResyncing, FullResync: true}}},
		&ListGroupsResp{Groups: []GroupInfo{{ID: 1, Epoch: 2, Primary: 3, Secondary: 4}}, Version: 1 << 40},
		&ServerHeartbeatResp{Groups: []GroupInfo{{ID: 5, Epoch: 9, Primary: 1, Secondary: 2, FullResync: true}}, LeaseMs: 2000, Version: 77777},
		&GroupResp{Group: GroupInfo{ID: 5, Epoch: 9, Primary: 1, Secondary: 2, PrimaryAddr: "a:1"}, Version: 1 << 33},
		&MirrorCreateReq{Hdr: ReqHeader{1, 2}, Auto: true, Pairs: []uint32{1, 2}},
		&MirrorReportReq{ServerID: 1, Group: 5, Epoch: 9, Target: 1, Event: MirrorSecondaryLost, Detail: "x"},
		&RegisterServerReq{Addr: "a:1", Domain: "rack1"},
		&SetDirLayoutReq{Dir: 2, StripeCount: 1, Mirror: DirMirrorOn},
		&MirrorGroupReq{Group: 3, Epoch: 9},
		&ClusterStatusResp{Targets: []TargetInfo{{ID: 3}}, Groups: []GroupInfo{{ID: 1, Epoch: 2, Primary: 3, Secondary: 4, PrimaryAddr: "a:1"}}},
		&ServerHeartbeatReq{ServerID: 1, Targets: []TargetUsage{{1, 2, 3}}, FSIDs: []uint64{7}, RawFree: []uint64{4}},
		&ServerHeartbeatReq{ServerID: 1, Targets: []TargetUsage{{1, 2, 3}}, Unsynced: []TargetUnsynced{{Chunks: 4, Bytes: 5, OldestMs: 6}}},
		&SetAttrReq{Valid: SetMode | SetSize, Size: 1 << 40, Mtime: -5},
		&SessionHeartbeatReq{ClientID: 3, OpenInodes: []uint64{4, 5}, LockEpoch: 77, ListedAfter: 1763885000123456789},
		&SessionHeartbeatReq{ClientID: 3, Gateway: &GatewayReport{Address: "a:2049", Exports: []string{"/=rw,clients=*"}, Ops: 5}},
		&ClusterStatusResp{Targets: []TargetInfo{{ID: 3}}, Gateways: []GatewayStatus{{Client: 2, Report: GatewayReport{Address: "a:2049", Clients: 1}}}},
		&ClusterStatusResp{Targets: []TargetInfo{{ID: 3}}, Delegations: []DelegationInfo{{Client: 2, Dir: 9, Epoch: 40, GrantedMs: 5, Recalled: true}}},
		&LookupReq{Parent: 1, Name: "a", Client: 7},
		&GetAttrReq{Ino: 5, Client: 7},
		&ReadDirReq{Dir: 1, After: "b", Limit: 9, Plus: true, Client: 7},
		&SessionHeartbeatResp{LockEpoch: 9, Now: 1763885000123456789},
		&ListChunksReq{Target: 3, From: 300, Max: 8192},
		&ListChunksResp{Inos: []uint64{5, 1 << 40}, Bytes: []uint64{7, 0}, Next: 301, Done: true},
		&InodesKnownReq{Inos: []uint64{1, 2, 1 << 33}},
		&InodesKnownResp{NextIno: 1 << 20, Known: []bool{true, false, true}},
		&SeekReq{Chunk: ChunkID{Target: 3, Ino: 1 << 40}, Off: 1 << 33, Data: true},
		&AttrResp{Attr: Attr{Ino: 5, Size: 7, Blocks: 3, BlocksKnown: true}, Stamp: Stamp{Index: 9, Term: 2}},
		&ChangeResp{Attr: Attr{Ino: 5, Blocks: 8, BlocksKnown: true}, Dir: Attr{Ino: 1}, Index: 4, Term: 1},
		&LinkResp{AttrResp: AttrResp{Attr: Attr{Ino: 5, Nlink: 2}, Stamp: Stamp{Index: 9, Term: 2}}, Dir: Attr{Ino: 1, Mode: 0o40755, Mtime: 3}},
		&DirChangeResp{Stamp: Stamp{Index: 9, Term: 2}, Dir: Attr{Ino: 1, Mtime: 3}, NewDir: Attr{Ino: 2}, Entry: Attr{Ino: 5}},
		&CommitSizeReq{Hdr: ReqHeader{1, 2}, Ino: 5, Size: 9, Mtime: 3, Alloc: []SlotAlloc{{0, 4096}, {3, 1 << 33}}},
		&CommitSizeReq{Hdr: ReqHeader{1, 2}, Ino: 5, Size: 9, Mtime: 3, Alloc: []SlotAlloc{{0, 4096}}, Deferred: true},
		&ChunkStatResp{Size: 5, Exists: true, Alloc: 4096, HasAlloc: true},
		&WriteResp{Alloc: 8192, HasAlloc: true},
		&SeekResp{Off: 1<<33 + 5, Found: true},
		&LockReq{ClientID: 1, Ino: 2, Start: 3, End: 4, Type: LockRead, Reclaim: true},
		&LockReq{ClientID: 1, Ino: 2, Type: LockUnlock, Handle: 1 << 40, CloseHandle: true},
	}
	for _, m := range msgs {
		b := Marshal(m)
		// Decode into a fresh value of the same type and re-encode.
		fresh := newLike(m)
		if err := Unmarshal(b, fresh); err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !bytes.Equal(Marshal(fresh), b) {
			t.Fatalf("%T: round trip differs", m)
		}
		// Every strict prefix fails to decode, never panics.
		// Fields appended within version 1 may be missing (older peers):
		// exactly that prefix decodes, with the fields zero.
		optional := map[int]bool{}
		for _, n := range optionalTails(m) {
			optional[len(b)-n] = true
		}
		for i := 0; i < len(b); i++ {
			err := Unmarshal(b[:i], newLike(m))
			if optional[i] {
				if err != nil {
					t.Fatalf("%T without its optional tail of %d bytes: %v", m, len(b)-i, err)
				}
				continue
			}
			if err == nil {
				t.Fatalf("%T: prefix %d decoded", m, i)
			}
		}
	}
}

// optionalTails are the encoded sizes of the trailing runs of m's fields
// that decoders treat as optional (each run may be missing).
func optionalTails(m Message) []int {
	var tails []int
	add := func(fields ...func(*Enc)) {
		var e Enc
		for _, f := range fields {
			f(&e)
		}
		tails = append(tails, len(e.B))
	}
	blocks := func(a *Attr) func(*Enc) { return func(e *Enc) { encodeBlocks(e, a) } }
	switch x := m.(type) {
	case *ReadDirResp:
		var fs []func(*Enc)
		for i := range x.Entries {
			fs = append(fs, blocks(&x.Entries[i].Attr))
		}
		add(fs...)
	case *AttrResp:
		add(blocks(&x.Attr))
		add(func(e *Enc) { x.Stamp.Encode(e) }, blocks(&x.Attr))
	case *LinkResp:
		dir := func(e *Enc) {
			if x.Dir.Ino != 0 {
				x.Dir.Encode(e)
			}
		}
		if x.Dir.Ino != 0 {
			add(dir)
		}
		add(blocks(&x.Attr), dir)
		add(func(e *Enc) { x.Stamp.Encode(e) }, blocks(&x.Attr), dir)
	case *DirChangeResp:
		dirs := func(e *Enc) { x.Dir.Encode(e); x.NewDir.Encode(e); x.Entry.Encode(e); x.Other.Encode(e) }
		add(dirs)
		add(func(e *Enc) { x.Stamp.Encode(e) }, dirs) // an empty answer (a rename of a name onto its own inode)
	case *ChangeResp:
		add(blocks(&x.Attr))
	case *CommitSizeReq:
		add(func(e *Enc) { e.Bool(x.Deferred) })
		add(func(e *Enc) { EncodeSlotAllocs(e, x.Alloc) }, func(e *Enc) { e.Bool(x.Deferred) })
	case *ChunkStatResp:
		add(func(e *Enc) { e.U64(x.Alloc); e.Bool(x.HasAlloc) })
	case *WriteResp:
		add(func(e *Enc) { x.Encode(e) })
	case *LockReq:
		add(func(e *Enc) { e.U64(x.Handle); e.Bool(x.CloseHandle) })
		add(func(e *Enc) { e.Bool(x.Reclaim) }, func(e *Enc) { e.U64(x.Handle); e.Bool(x.CloseHandle) })
	case *SessionHeartbeatReq:
		gw := func(e *Enc) {
			if x.Gateway != nil {
				e.Bool(true)
				x.Gateway.Encode(e)
			}
		}
		add(gw)
		add(func(e *Enc) { e.I64(x.ListedAfter) }, gw)
		add(func(e *Enc) { e.U64(x.LockEpoch) }, func(e *Enc) { e.I64(x.ListedAfter) }, gw)
	case *ClusterStatusResp:
		gateways := func(e *Enc) {
			e.U64(uint64(len(x.Gateways)))
			for i := range x.Gateways {
				e.U64(x.Gateways[i].Client)
				x.Gateways[i].Report.Encode(e)
			}
		}
		groups := func(e *Enc) {
			e.U64(uint64(len(x.Groups)))
			for i := range x.Groups {
				x.Groups[i].Encode(e)
			}
		}
		unsynced := func(e *Enc) { encodeUnsynced(e, x.Unsynced) }
		delegs := func(e *Enc) { encodeDelegInfos(e, x.Delegations) }
		add(delegs)
		add(gateways, delegs)
		add(groups, gateways, delegs)
		add(unsynced, groups, gateways, delegs)
		add(func(e *Enc) { e.U64(x.FreePendingFiles); e.U64(x.FreePendingBytes) }, unsynced, groups, gateways, delegs)
	case *LookupReq:
		if x.Client != 0 {
			add(func(e *Enc) { e.U64(x.Client) })
		}
	case *GetAttrReq:
		if x.Client != 0 {
			add(func(e *Enc) { e.U64(x.Client) })
		}
	case *ReadDirReq:
		if x.Client != 0 {
			add(func(e *Enc) { e.U64(x.Client) })
		}
	case *ServerHeartbeatReq:
		add(func(e *Enc) { encodeUnsynced(e, x.Unsynced) })
	case *ServerHeartbeatResp:
		full := func(e *Enc) { e.U32s(fullResyncIDs(x.Groups)) }
		version := func(e *Enc) { e.U64(x.Version) }
		add(version)
		add(full, version)
		add(func(e *Enc) { x.Encode(e) }) // older services answered Empty
	case *ListGroupsResp:
		version := func(e *Enc) { e.U64(x.Version) }
		add(version)
		add(func(e *Enc) { e.U32s(fullResyncIDs(x.Groups)) }, version)
	case *GroupResp:
		add(func(e *Enc) { e.U64(x.Version) })
	case *RegisterServerReq:
		add(func(e *Enc) { e.String(x.Domain) })
	case *SetDirLayoutReq:
		add(func(e *Enc) { e.U8(x.Mirror) })
	case *MirrorGroupReq:
		add(func(e *Enc) { e.U64(x.Epoch) })
	case *SessionHeartbeatResp:
		add(func(e *Enc) { e.I64(x.Now) })
		add(func(e *Enc) { e.U64(x.LockEpoch) }, func(e *Enc) { e.I64(x.Now) })
	}
	return tails
}

// newLike returns a zero value of m's type.
func newLike(m Message) Message {
	return reflect.New(reflect.TypeOf(m).Elem()).Interface().(Message)
}

// Answers recorded for retries before stamps existed (dedupe records hold
// encoded answers) still decode, with no stamp; new ones carry it.
func TestStampOptional(t *testing.T) {
	a := &AttrResp{Attr: Attr{Ino: 5, Size: 7}, Stamp: Stamp{Index: 9, Term: 2}}
	var got AttrResp
	if err := Unmarshal(Marshal(a), &got); err != nil || got.Stamp != a.Stamp || got.Attr.Ino != 5 || got.Attr.Size != 7 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	old := Marshal(&a.Attr) // an AttrResp as encoded before stamps
	got = AttrResp{Stamp: Stamp{Index: 1, Term: 1}}
	if err := Unmarshal(old, &got); err != nil || got.Attr.Ino != 5 || got.Attr.Size != 7 || got.Stamp != (Stamp{}) {
		t.Fatalf("answer without a stamp: %+v %v", got, err)
	}
	var st Stamp
	if err := Unmarshal(nil, &st); err != nil || st != (Stamp{}) {
		t.Fatalf("empty answer as a stamp: %+v %v", st, err)
	}
	if err := Unmarshal(Marshal(&Stamp{Index: 3, Term: 4}), &st); err != nil || st != (Stamp{3, 4}) {
		t.Fatalf("stamp round trip: %+v %v", st, err)
	}
	if err := Unmarshal(Marshal(&Stamp{Index: 3, Term: 4})[:1], &st); err == nil {
		t.Fatal("a truncated stamp decoded")
	}
}

// TestLockEpochOptional: answers of older services (Empty for SetLk and
// heartbeats) read as lock epoch 0, which clients ignore.
func TestLockEpochOptional(t *testing.T) {
	var g LockGrant
	if err := Unmarshal(Marshal(&Empty{}), &g); err != nil || g.Epoch != 0 {
		t.Fatalf("empty SetLk answer: %+v %v", g, err)
	}
	if err := Unmarshal(Marshal(&LockGrant{Epoch: 1 << 60}), &g); err != nil || g.Epoch != 1<<60 {
		t.Fatalf("grant round trip: %+v %v", g, err)
	}
	var h SessionHeartbeatResp
	if err := Unmarshal(nil, &h); err != nil || h.LockEpoch != 0 {
		t.Fatalf("empty heartbeat answer: %+v %v", h, err)
	}
	if err := Unmarshal(Marshal(&SessionHeartbeatResp{LockEpoch: 9}), &h); err != nil || h.LockEpoch != 9 {
		t.Fatalf("heartbeat answer round trip: %+v %v", h, err)
	}
}

// TestDirAttrsOptional: the directory attributes that rmdir, rename and
// link answers gained are absent from older services' answers (and from
// answers replayed for a retry): those decode with them unknown, and an
// older client reads the new answers as it read the old ones.
func TestDirAttrsOptional(t *testing.T) {
	full := &DirChangeResp{Stamp: Stamp{Index: 9, Term: 2}, Dir: Attr{Ino: 1, Nlink: 3, Mtime: 5}, NewDir: Attr{Ino: 2},
		Entry: Attr{Ino: 7}, Other: Attr{Ino: 8}}
	var st Stamp
	if err := Unmarshal(Marshal(&Stamp{Index: 9, Term: 2}), &st); err != nil {
		t.Fatal(err)
	}
	var d DirChangeResp
	if err := Unmarshal(Marshal(&st), &d); err != nil || d.Stamp != st || d.Dir.Ino != 0 || d.Entry.Ino != 0 {
		t.Fatalf("a bare stamp as DirChangeResp: %+v %v", d, err)
	}
	if err := Unmarshal(nil, &d); err != nil || !reflect.DeepEqual(d, DirChangeResp{}) {
		t.Fatalf("an empty answer as DirChangeResp: %+v %v", d, err)
	}
	// An older client decodes into a Stamp and leaves the tail unread.
	dec := NewDec(Marshal(full))
	st = Stamp{}
	st.Decode(dec)
	if dec.Err() != nil || st != full.Stamp {
		t.Fatalf("DirChangeResp as a Stamp: %+v %v", st, dec.Err())
	}
	l := &LinkResp{AttrResp: AttrResp{Attr: Attr{Ino: 5}, Stamp: Stamp{Index: 9, Term: 2}}, Dir: Attr{Ino: 1, Nlink: 3}}
	var got LinkResp
	if err := Unmarshal(Marshal(&l.AttrResp), &got); err != nil || got.Attr.Ino != 5 || got.Dir.Ino != 0 {
		t.Fatalf("an AttrResp as LinkResp: %+v %v", got, err)
	}
	dec = NewDec(Marshal(l)) // an older client
	var old AttrResp
	old.Decode(dec)
	if dec.Err() != nil || old.Attr.Ino != 5 || old.Stamp != l.Stamp {
		t.Fatalf("LinkResp as an AttrResp: %+v %v", old, dec.Err())
	}
}
