#!/usr/bin/env bash
# The unbounded fault soak: `strata chaos` with each metadata voter on a
# network namespace of its own, faults of every kind drawn from a seed
# (kill -9, SIGSTOP, partitions, one-way drops, a follower's link down,
# delay) for DURATION,
# under a load of creates/stats/removes and fsync'ed 1 MiB records, with the
# history recorders checked for linearizability. It prints each fault as it
# injects it and, at the end, the stall figures per fault kind and what the
# checks found (and the totals line again, last); it exits 1 if an operation
# failed, a file was lost or doubled, a record was bad, a history was not
# linearizable, a lock was held twice or a trial found a problem. Needs
# root, FUSE, iproute2, nftables and nsenter (scripts/install-deps.sh).
#
#   DURATION=1h SEED=42 bash scripts/soak.sh [more strata chaos flags]
#   MIRROR=1 TRIALS=200 SEED=42 bash scripts/soak.sh   # issue 21's soak
#
# MIRROR=1: the mirrored cluster (strata chaos --mirror: 4 stores of 2
# targets, each store on a host of its own) and every fault of issue 21's
# list (kill-primary, kill-secondary, stop-primary, partition-primary,
# heartbeat-loss-primary, link-down-store, the disk faults,
# kill-primary-leader, kill-all, kill-lock-client), for TRIALS faults
# (default 200) unless DURATION is given.
# Environment: DURATION (default 1h; with MIRROR=1 none), TRIALS (instead of
# DURATION), FAULTS (comma-separated, default all of the mode's), SEED
# (default: from the clock; printed, replays the schedule), DIR (the work
# directory, default a fresh one under /tmp, removed unless --keep), JSON
# (the report, default soak-<seed>.json here), STRATA (the binary, default
# strata on the PATH, else ./strata built from this checkout).
set -euo pipefail

if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
	sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
fi

here=$(cd "$(dirname "$0")/.." && pwd)
mirror=${MIRROR:-0}
if [[ "$mirror" == 1 ]]; then
	faults=${FAULTS:-kill-primary,kill-secondary,stop-primary,partition-primary,heartbeat-loss-primary,link-down-store,disk-eio-primary,disk-full-secondary,disk-slow-primary,kill-primary-leader,kill-all,kill-lock-client}
	mode=(--mirror)
	[[ -z "${DURATION:-}" ]] && TRIALS=${TRIALS:-200}
else
	faults=${FAULTS:-kill-leader,kill-follower,stop-leader,partition-leader,one-way,link-down,delay}
	mode=()
fi
if [[ -n "${TRIALS:-}" ]]; then
	length=(--trials "$TRIALS")
	what="$TRIALS faults"
else
	length=(--duration "${DURATION:-1h}")
	what="${DURATION:-1h}"
fi
seed=${SEED:-$(date +%s%N)}
strata=${STRATA:-}
if [[ -z "$strata" ]]; then
	if command -v strata >/dev/null; then
		strata=$(command -v strata)
	else
		(cd "$here" && go build -o strata ./cmd/strata)
		strata=$here/strata
	fi
fi
dir=${DIR:-}
made=
if [[ -z "$dir" ]]; then
	dir=$(mktemp -d /tmp/strata-soak.XXXXXX)
	made=1
fi
json=${JSON:-$PWD/soak-$seed.json}
# strata chaos wants an empty directory of its own.
work=$dir/chaos

log=$(mktemp /tmp/strata-soak-log.XXXXXX)
echo "soak: $strata chaos ${mode[*]} for $what, faults $faults, seed $seed; report $json"
set +e
"$strata" chaos "${mode[@]}" --dir "$work" --hosts netns "${length[@]}" --faults "$faults" \
	--seed "$seed" --json "$json" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [[ -n "$made" ]]; then
	rmdir "$dir" 2>/dev/null || true # left when --keep kept the work directory
fi
grep -E '^chaos: (totals|locks):' "$log" || true
rm -f "$log"
echo "soak: exit status $rc (seed $seed; report $json)"
exit $rc
