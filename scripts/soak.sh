#!/usr/bin/env bash
# The unbounded fault soak: `strata chaos` with each metadata voter on a
# network namespace of its own, faults of every kind drawn from a seed
# (kill -9, SIGSTOP, partitions, one-way drops, a follower's link down,
# delay) for DURATION,
# under a load of creates/stats/removes and fsync'ed 1 MiB records, with the
# history recorders checked for linearizability. It prints each fault as it
# injects it and, at the end, the stall figures per fault kind and what the
# checks found; it exits 1 if an operation failed, a file was lost or
# doubled, a record was bad or a history was not linearizable. Needs root,
# FUSE, iproute2, nftables and nsenter (scripts/install-deps.sh).
#
#   DURATION=1h SEED=42 bash scripts/soak.sh [more strata chaos flags]
#
# Environment: DURATION (default 1h), FAULTS (comma-separated, default all),
# SEED (default: from the clock; printed, replays the schedule), DIR (the
# work directory, default a fresh one under /tmp, removed unless --keep),
# JSON (the report, default soak-<seed>.json here), STRATA (the binary,
# default strata on the PATH, else ./strata built from this checkout).
set -euo pipefail

if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
	sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
fi

here=$(cd "$(dirname "$0")/.." && pwd)
duration=${DURATION:-1h}
faults=${FAULTS:-kill-leader,kill-follower,stop-leader,partition-leader,one-way,link-down,delay}
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

echo "soak: $strata chaos for $duration, faults $faults, seed $seed; report $json"
rc=0
"$strata" chaos --dir "$work" --hosts netns --duration "$duration" --faults "$faults" \
	--seed "$seed" --json "$json" "$@" || rc=$?
if [[ -n "$made" ]]; then
	rmdir "$dir" 2>/dev/null || true # left when --keep kept the work directory
fi
echo "soak: exit status $rc (seed $seed; report $json)"
exit $rc
