// Package failpoint lets a test, or the environment of a real process, make
// named points of the code fail: panic, die abruptly, stall, or return an
// error that the call site turns into EIO. It is how the fault harness puts
// a crash between two durable steps (after the state machine applied a
// create and before the reply, say) without editing the code under test.
//
// # Concepts
//
// A point is a call at a named place:
//
//	failpoint.Hit("some/point")                        // may panic, exit or sleep
//	err := failpoint.Eval("consensus/before-log-sync") // may also return an error
//	err := failpoint.EvalSub("meta/before-reply", c.Op) // c.Op.String() == "create"
//
// Unarmed (the normal case) a call is one atomic load. A point is armed with
// an action by Arm (tests in the same process) or, for real processes, by the
// environment variable STRATA_FAILPOINTS, read once at process start:
//
//	STRATA_FAILPOINTS="meta/after-apply=1*exit,consensus/after-log-sync=sleep(200ms)"
//
// or, to switch points on and off while a real process runs (a fault held
// for a while), by a file named in STRATA_FAILPOINTS_FILE, which holds a
// specification of the same form and is read every 100 ms: each change
// disarms what the file armed before and arms what it says now (empty or
// missing: nothing). `strata chaos` drops a store's heartbeats this way.
//
// # Actions
//
//	panic         panic at the point
//	exit          SIGKILL the process itself: no deferred calls, no flushing,
//	              as kill -9 (what was written to the kernel survives)
//	sleep(D)      stall for D (a time.ParseDuration string)
//	error         Eval returns an error wrapping ErrInjected (the call site
//	              turns it into EIO); at a Hit point, which cannot return
//	              one, error panics
//	off           nothing (disarm)
//
// An action may carry a count: "N*action" fires only on the N-th hit of the
// point and never again ("1*exit" = the first hit; "3*exit" = the third);
// "N+action" fires on the N-th hit and every one after. Without a count an
// action fires on every hit.
//
// HitSub and EvalSub points have a sub-name (the metadata command, e.g. "create"):
// "meta/before-reply/create=1*exit" arms only creates' replies, while
// "meta/before-reply=..." arms every mutation's. Hits are counted per armed
// name.
//
// # Points
//
// The names wired into the code (keep this list true):
//
//	consensus/before-log-sync  the raft WAL's deferred syncer, before its
//	                           fdatasyncs (error: the sync fails, sticky)
//	consensus/after-log-sync   the same, after them (error: as before)
//	meta/before-apply[/OP]     the metadata FSM's ApplyBatch, before it
//	                           applies a group of committed entries; OP is
//	                           the last command's (create, unlink, ...)
//	meta/after-apply[/OP]      the same, after the batch was written to the
//	                           store and before any answer is returned
//	client/open-before-getattr  a client's Open, before it asks for the
//	                           file's attributes (a small file's early
//	                           read is under way)
//	client/after-truncate-chunks  a client's truncate (SetAttr of the
//	                           size), after the chunks were cut and before
//	                           the size is set in metadata
//	store/before-heartbeat     a storage server's heartbeat loop, before
//	                           each heartbeat (error: it is not sent, as
//	                           if lost; registration, group map refreshes
//	                           and mirror reports still go)
//	store/before-heartbeat-install  the same loop, between a heartbeat's
//	                           answer and its install (sleep: the answer
//	                           arrives late, after newer group maps)
//	meta/before-reply[/OP]     the metadata service's propose, once the
//	                           state machine's answer is known (and durable
//	                           when the reply waits for that), before it is
//	                           returned; OP is the command (create, unlink,
//	                           rename, setattr, ...); error: the client gets
//	                           EIO although the change was made
//
// # Pitfalls
//
// The FSM's points are hit for entries replayed at start too (raft applies
// the log after its last snapshot again; the FSM skips what its store
// already holds, after meta/before-apply): arm "meta/after-apply/create"
// in a process whose log holds no create, or count the replayed ones.
//
// STRATA_FAILPOINTS is read once, in this package's init: arming it later in
// the process's own environment changes nothing (use Arm). A malformed
// specification is reported on stderr and ignored, so that a typo cannot make
// a production process fail; tests check Armed.
package failpoint
