#!/usr/bin/env bash
# The Resync and Repair bars of issue 21 (mirror groups), on `strata up --ha`
# (3 metadata voters, 4 storage servers x 2 targets paired into 4 mirror
# groups, each a process of its own; the root mirrored):
#
#   resync: a data set of SIZE_GIB in NFILES files (stripe count 1, so each
#     file lives on one group) is written; the secondary's server of the
#     group holding the most files is stopped (SIGSTOP) while REWRITE_GIB of
#     that group's files are rewritten in place (the primary degrades the
#     group when its forward times out and records what changed); SIGCONT;
#     once every group is in sync again, the bytes the resyncs copied
#     (strata_mirror_resync_bytes_total of every store) must be at most
#     1.2 x the rewritten bytes. Every file must read back as expected and
#     `strata scrub` must find the two copies equal.
#   repair: FLIPS random 4 KiB blocks (one byte each) of the chunk data
#     files of one copy (a group's secondary target) are flipped on disk;
#     after dropping the page cache every file must read back right through
#     the mount (blocks read from the bad copy are healed from the other),
#     one `strata scrub --repair` must leave no bad block, a second
#     `strata scrub` must pass, and every flipped block must equal the
#     other copy's again.
#
# Usage (as root, FUSE available): scripts/mirror-bars.sh [WORKDIR]
#   WORKDIR (default /var/tmp/mirror-bars) holds the binary, the cluster
#   (WORKDIR/data, removed at the end unless KEEP_DATA=1; its logs are kept
#   in WORKDIR/logs), the mount point and the summary (WORKDIR/summary.txt).
# Environment: SIZE_GIB (10), REWRITE_GIB (1), NFILES (10), FLIPS (100),
#   STRATA_BIN (default: go build -o WORKDIR/strata ./cmd/strata),
#   SCRUB_RATE (scrub --rate, default 0: no limit), KEEP_DATA (0),
#   REWRITE_MODE: seq (default: each rewritten file from its start, in 1 MiB
#   writes) or random4k (4 KiB writes at random block offsets spread over
#   all of the group's files, REWRITE_GIB in all);
#   DEGRADE_FIRST (1): one 4 KiB write (of the bytes already there) degrades
#   the group before the rewrites start; 0: the rewrites themselves meet the
#   stopped secondary (the forwards' 5 s timeout).
# A quick run for development: SIZE_GIB=2 REWRITE_GIB=0.2 scripts/mirror-bars.sh
# Exit status: 0 both bars met, 1 a bar failed, 2 cannot run.
set -euo pipefail

work=${1:-/var/tmp/mirror-bars}
SIZE_GIB=${SIZE_GIB:-10}
REWRITE_GIB=${REWRITE_GIB:-1}
NFILES=${NFILES:-10}
FLIPS=${FLIPS:-100}
REWRITE_MODE=${REWRITE_MODE:-seq}
DEGRADE_FIRST=${DEGRADE_FIRST:-1}
SCRUB_RATE=${SCRUB_RATE:-0}
KEEP_DATA=${KEEP_DATA:-0}

die() { echo "mirror-bars: $*" >&2; exit 2; }
log() { echo "mirror-bars: $(date -u +%H:%M:%S) $*" >&2; }

[[ $(id -u) -eq 0 ]] || die "run as root (a FUSE mount, drop_caches, signals to the cluster's processes)"
[[ -c /dev/fuse ]] || die "no /dev/fuse: FUSE is not available here"
command -v python3 >/dev/null || die "python3 is needed"
[[ $REWRITE_MODE == seq || $REWRITE_MODE == random4k ]] || die "REWRITE_MODE is seq or random4k, not '$REWRITE_MODE'"

file_mib=$(python3 -c "print(int(float('$SIZE_GIB')*1024/int('$NFILES')))")
rewrite_mib=$(python3 -c "print(int(float('$REWRITE_GIB')*1024))")
((file_mib > 0 && rewrite_mib > 0)) || die "SIZE_GIB/NFILES and REWRITE_GIB must be at least 1 MiB"

repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
work=$(cd "$work" && pwd)
D=$work/data
M=$work/mnt
if mountpoint -q "$M" 2>/dev/null; then die "$M is mounted (another run?)"; fi
rm -rf "$D" "$work/logs"
mkdir -p "$M"
summary=$work/summary.txt
: >"$summary"

if [[ -n ${STRATA_BIN:-} ]]; then
  bin=$STRATA_BIN
else
  bin=$work/strata
  log "building $bin"
  (cd "$repo" && PATH=$PATH:/usr/local/go/bin go build -o "$bin" ./cmd/strata)
fi

up_pid=""
stopped_pid="" # a store we SIGSTOPped and not yet continued
cleanup() {
  local rc=$?
  set +e
  if [[ -n $stopped_pid ]]; then kill -CONT "$stopped_pid" 2>/dev/null; fi
  if [[ -n $up_pid ]] && kill -0 "$up_pid" 2>/dev/null; then
    kill -TERM "$up_pid"
    for _ in $(seq 60); do kill -0 "$up_pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$up_pid" 2>/dev/null; then
      echo "mirror-bars: strata up (pid $up_pid) did not stop within 60 s of SIGTERM: SIGKILL" >&2
      kill -KILL "$up_pid"
    fi
    wait "$up_pid" 2>/dev/null
  fi
  if mountpoint -q "$M" 2>/dev/null; then umount -l "$M"; fi
  if [[ -d $D/logs ]]; then cp -r "$D/logs" "$work/logs"; fi
  if [[ $KEEP_DATA != 1 ]]; then rm -rf "$D" "$work/src.bin" "$work/rewrite.bin" "$work/expect"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the cluster ---------------------------------------------------------

log "starting strata up --ha (data $D, mount $M; log $work/up.log)"
"$bin" up --ha --data "$D" --mount "$M" >"$work/up.log" 2>&1 &
up_pid=$!
for _ in $(seq 120); do
  kill -0 "$up_pid" 2>/dev/null || { tail -20 "$work/up.log" >&2; die "strata up exited"; }
  if [[ -f $D/ha.json ]] && mountpoint -q "$M"; then break; fi
  sleep 0.5
done
mountpoint -q "$M" || die "no mount at $M within 60 s (see $work/up.log)"

meta=$(python3 -c 'import json,sys; print(",".join(json.load(open(sys.argv[1]))["voters"]))' "$D/ha.json")
metrics_addrs=$(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1])).get("store_metrics", [])))' "$D/ha.json")
[[ -n $metrics_addrs ]] || die "$D/ha.json names no store_metrics: this strata up --ha gives its storage servers no --metrics-addr"

status_json() { "$bin" status --json --meta "$meta" --key-file "$D/cluster.key" 2>/dev/null; }

# groups_state prints "ID STATE" per mirror group.
groups_state() {
  status_json | python3 -c 'import json,sys
for g in json.load(sys.stdin).get("mirror_groups") or []: print(g["id"], g["state"])'
}

# wait_in_sync SECONDS: until every one of the 4 groups is in sync.
wait_in_sync() {
  local deadline=$((SECONDS + $1)) st=""
  while ((SECONDS < deadline)); do
    st=$(groups_state || true)
    if [[ $(grep -c ' in_sync$' <<<"$st") -eq 4 ]]; then return 0; fi
    sleep 1
  done
  echo "mirror-bars: the mirror groups are not all in sync after $1 s:" >&2
  echo "$st" >&2
  return 1
}

# metric_sum NAME [LABEL_FILTER]: the sum of a counter over every storage server.
metric_sum() {
  python3 - "$1" "${2:-}" $metrics_addrs <<'EOF'
import sys, urllib.request
name, filt, addrs = sys.argv[1], sys.argv[2], sys.argv[3:]
total = 0.0
for a in addrs:
    body = urllib.request.urlopen(f"http://{a}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if filt and filt not in line:
                continue
            total += float(line.rsplit(" ", 1)[1])
print(int(total))
EOF
}

# scrub_totals FILE: "bad repaired unrepairable mismatched peer_missing scrubbed/targets" of a scrub --json answer.
scrub_totals() {
  python3 -c 'import json,sys
r=json.load(open(sys.argv[1])) or []
s=lambda k: sum(t.get(k,0) for t in r)
print(s("bad_blocks"), s("repaired"), s("unrepairable"), s("mismatched"), s("peer_missing"), "%d/%d" % (sum(1 for t in r if t.get("scrubbed")), len(r)))' "$1"
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

wait_in_sync 60 || die "the cluster did not come up with 4 mirror groups in sync"
log "cluster up: voters $meta, store metrics $metrics_addrs"

# --- data set ------------------------------------------------------------

log "making the source data: $file_mib MiB file, $rewrite_mib MiB rewrite data (from /dev/urandom)"
dd if=/dev/urandom of="$work/src.bin" bs=1M count="$file_mib" iflag=fullblock status=none
dd if=/dev/urandom of="$work/rewrite.bin" bs=1M count="$rewrite_mib" iflag=fullblock status=none
src_sum=$(md5sum <"$work/src.bin" | cut -d' ' -f1)

mkdir "$M/data"
"$bin" stripe set --count 1 "$M/data" >/dev/null
declare -A want group_of
log "writing $NFILES x $file_mib MiB through the mount"
t0=$SECONDS
for i in $(seq "$NFILES"); do
  f=$M/data/f$i
  dd if="$work/src.bin" of="$f" bs=4M conv=fsync status=none
  want[$f]=$src_sum
  group_of[$f]=$("$bin" stripe get --json "$f" | python3 -c 'import json,sys; t=json.load(sys.stdin)["targets"]; assert len(t)==1 and t[0]>>31, t; print(t[0]&0x7fffffff)')
done
write_s=$((SECONDS - t0))
log "written in ${write_s} s"

# The group holding the most files (the lowest id of a tie).
G=$(for f in "${!group_of[@]}"; do echo "${group_of[$f]}"; done | sort -n | uniq -c | sort -k1,1nr -k2,2n | awk 'NR==1{print $2}')
mapfile -t gfiles < <(for f in "${!group_of[@]}"; do [[ ${group_of[$f]} == "$G" ]] && echo "$f"; done | sort -V)
((${#gfiles[@]} * file_mib >= rewrite_mib)) ||
  die "group $G holds ${#gfiles[@]} files of $file_mib MiB, less than the $rewrite_mib MiB to rewrite: raise SIZE_GIB or lower NFILES"

wait_in_sync 120 || die "groups not in sync after the writes"

# --- resync bar ----------------------------------------------------------

read -r sec_addr <<<"$(status_json | python3 -c 'import json,sys
for g in json.load(sys.stdin)["mirror_groups"]:
    if g["id"] == int(sys.argv[1]): print(g["secondary_server"])' "$G")"
[[ -n $sec_addr ]] || die "no secondary server for group $G"
mapfile -t pids < <(ps -eo pid=,args= | awk -v a="$sec_addr" '{for(i=2;i<NF;i++) if($i=="store" && $(i+1)=="--listen" && $(i+2)==a){print $1; break}}')
((${#pids[@]} == 1)) || die "found ${#pids[@]} processes serving store --listen $sec_addr (want 1): ${pids[*]:-}"
sec_pid=${pids[0]}

resync0=$(metric_sum strata_mirror_resync_bytes_total)
log "resync: stopping group $G's secondary server $sec_addr (pid $sec_pid); rewriting $rewrite_mib MiB ($REWRITE_MODE) of ${#gfiles[@]} files on group $G"
kill -STOP "$sec_pid"
stopped_pid=$sec_pid
if [[ $DEGRADE_FIRST == 1 ]]; then
  # One 4 KiB write of the bytes already there: its forward times out and
  # the primary degrades the group before the rewrites start.
  dd if="$work/src.bin" of="${gfiles[0]}" bs=4k count=1 conv=notrunc,fsync status=none
  for _ in $(seq 60); do
    [[ $(groups_state | awk -v g="$G" '$1==g{print $2}') == degraded ]] && break
    sleep 0.5
  done
fi
t0=$SECONDS
touched=""
if [[ $REWRITE_MODE == seq ]]; then
  left=$rewrite_mib done_mib=0
  for f in "${gfiles[@]}"; do
    ((left > 0)) || break
    n=$((left < file_mib ? left : file_mib))
    dd if="$work/rewrite.bin" of="$f" bs=1M skip="$done_mib" count="$n" conv=notrunc,fsync status=none
    want[$f]=$({ dd if="$work/rewrite.bin" bs=1M skip="$done_mib" count="$n" status=none
      dd if="$work/src.bin" bs=1M skip="$n" status=none; } | md5sum | cut -d' ' -f1)
    left=$((left - n)) done_mib=$((done_mib + n))
  done
else
  # 4 KiB writes at random block offsets over all of the group's files,
  # applied alike to a local copy of each (the expected contents).
  mkdir -p "$work/expect"
  for f in "${gfiles[@]}"; do cp "$work/src.bin" "$work/expect/$(basename "$f")"; done
  touched=$(python3 - "$work/rewrite.bin" "$work/expect" "$((rewrite_mib << 20))" "${gfiles[@]}" <<'EOF2'
import os, random, sys
data, expect, total, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
size = os.path.getsize(files[0])
blocks = size // 4096
rng = random.Random(int.from_bytes(os.urandom(8), "little"))
src = memoryview(open(data, "rb").read())
fds = [(os.open(f, os.O_RDWR), os.open(os.path.join(expect, os.path.basename(f)), os.O_RDWR)) for f in files]
seen, regions = set(), set()
for i in range(total // 4096):
    k = rng.randrange(len(files))
    b = rng.randrange(blocks)
    off = (i * 4096) % (len(src) - 4095)
    buf = src[off:off + 4096]
    for fd in fds[k]:
        os.pwrite(fd, buf, b * 4096)
    seen.add((k, b))
    regions.add((k, b >> 8))
for m, e in fds:
    os.fsync(m)
    os.close(m)
    os.close(e)
print(f"distinct_4k_blocks={len(seen)} ({len(seen) * 4096} B) distinct_1m_regions={len(regions)} ({len(regions) << 20} B)")
EOF2
) || { echo "RESYNC  the random rewrite failed through the mount (an application error; see above and $work/up.log): FAILED" | tee -a "$summary"; exit 1; }
  for f in "${gfiles[@]}"; do want[$f]=$(md5sum <"$work/expect/$(basename "$f")" | cut -d' ' -f1); done
  rm -rf "$work/expect"
fi
rewrite_s=$((SECONDS - t0))
gstate=$(groups_state | awk -v g="$G" '$1==g{print $2}')
log "rewritten in ${rewrite_s} s; group $G is $gstate; continuing pid $sec_pid"
kill -CONT "$sec_pid"
stopped_pid=""
[[ $gstate == degraded ]] || die "group $G is '$gstate' after the rewrites with its secondary stopped, not degraded: the secondary did not miss them"

t0=$SECONDS
wait_in_sync 900 || die "groups not back in sync within 900 s"
resync_s=$((SECONDS - t0))
resync1=$(metric_sum strata_mirror_resync_bytes_total)
copied=$((resync1 - resync0))
rewrite_bytes=$((rewrite_mib << 20))
limit=$((rewrite_bytes * 12 / 10))
per_group=$(for a in $metrics_addrs; do curl -s --max-time 10 "http://$a/metrics"; done |
  awk '/^strata_mirror_resync_bytes_total\{/ { match($0, /group="[0-9]+"/); s[substr($0, RSTART + 7, RLENGTH - 8)] += $NF }
       END { for (g in s) printf "group %s %.0f B; ", g, s[g] }')
# The stores' own account, from their logs: each finished resync and what it copied.
done_lines=$(grep -ho 'msg="mirror resync done".*' "$D"/logs/store-*.log | sed 's/msg="mirror resync done" pkg=store //' | tr '\n' ';' || true)
log "resync copied $copied bytes (limit $limit) in ${resync_s} s: $per_group"

log "verifying the data set (page cache dropped) and both copies (strata scrub)"
drop_caches
bad_reads=0
for f in "${!want[@]}"; do
  got=$(md5sum <"$f" | cut -d' ' -f1) || got=ERROR
  if [[ $got != "${want[$f]}" ]]; then echo "mirror-bars: $f reads $got, want ${want[$f]}" >&2; bad_reads=$((bad_reads + 1)); fi
done
scrub1_rc=0
"$bin" scrub --json --rate "$SCRUB_RATE" --meta "$meta" --key-file "$D/cluster.key" >"$work/scrub-after-resync.json" 2>"$work/scrub-after-resync.err" || scrub1_rc=$?
read -r s1_bad _ _ s1_mism s1_missing s1_done <<<"$(scrub_totals "$work/scrub-after-resync.json")"

resync_ok=1
((copied <= limit && bad_reads == 0 && scrub1_rc == 0 && s1_bad == 0 && s1_mism == 0 && s1_missing == 0)) || resync_ok=0
{
  echo "RESYNC  data set ${SIZE_GIB} GiB ($NFILES x $file_mib MiB, written in ${write_s} s); group $G's secondary $sec_addr stopped while $rewrite_mib MiB were rewritten ($REWRITE_MODE, ${#gfiles[@]} files of the group, ${rewrite_s} s)"
  if [[ -n $touched ]]; then echo "RESYNC  rewrites touched $touched"; fi
  echo "RESYNC  copied_bytes=$copied rewritten_bytes=$rewrite_bytes ratio=$(python3 -c "print(round($copied/$rewrite_bytes, 3))") limit_bytes=$limit resync_seconds=$resync_s"
  echo "RESYNC  per group: $per_group"
  echo "RESYNC  store logs: ${done_lines:-none}"
  echo "RESYNC  files read wrong=$bad_reads; scrub: exit=$scrub1_rc bad_blocks=$s1_bad mismatched=$s1_mism peer_missing=$s1_missing targets_scrubbed=$s1_done"
  echo "RESYNC  bar (copied <= 1.2 x rewritten, data right, copies equal): $([[ $resync_ok == 1 ]] && echo MET || echo FAILED)"
} | tee -a "$summary"

# --- repair bar ----------------------------------------------------------

read -r sec_path pri_path <<<"$(status_json | python3 -c 'import json,sys
j=json.load(sys.stdin); path={t["id"]: t["path"] for t in j["targets"]}
for g in j["mirror_groups"]:
    if g["id"] == int(sys.argv[1]): print(path[g["secondary_target"]], path[g["primary_target"]])' "$G")"
[[ -d $sec_path && -d $pri_path ]] || die "cannot find group $G's target directories ($sec_path, $pri_path)"
log "repair: flipping $FLIPS random blocks of the chunk data files in $sec_path (group $G's secondary)"
python3 - "$sec_path" "$FLIPS" >"$work/flips.txt" <<'EOF'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
files = []
for d, _, names in os.walk(os.path.join(root, "chunks")):
    for nm in names:
        if nm.endswith(".data"):
            p = os.path.join(d, nm)
            blocks = os.path.getsize(p) // 4096
            if blocks:
                files.append((p, blocks))
total = sum(b for _, b in files)
if total < n:
    sys.exit(f"only {total} blocks under {root}")
rng = random.Random(int.from_bytes(os.urandom(8), "little"))
picked = sorted(rng.sample(range(total), n))
i, base = 0, 0
for g in picked:
    while g >= base + files[i][1]:
        base += files[i][1]
        i += 1
    p, blk = files[i][0], g - base
    off = blk * 4096 + rng.randrange(4096)
    fd = os.open(p, os.O_RDWR)
    b = os.pread(fd, 1, off)
    os.pwrite(fd, bytes([b[0] ^ 0xFF]), off)
    os.fsync(fd)
    os.close(fd)
    print(p, blk)
EOF
[[ $(wc -l <"$work/flips.txt") -eq $FLIPS ]] || die "flipped $(wc -l <"$work/flips.txt") blocks, not $FLIPS"
repairs0=$(metric_sum strata_mirror_repairs_total)
read_repairs0=$(metric_sum strata_mirror_repairs_total 'kind="read"')
drop_caches
bad_reads2=0
for f in "${!want[@]}"; do
  got=$(md5sum <"$f" | cut -d' ' -f1) || got=ERROR
  if [[ $got != "${want[$f]}" ]]; then echo "mirror-bars: $f reads $got, want ${want[$f]}" >&2; bad_reads2=$((bad_reads2 + 1)); fi
done
read_repairs=$(($(metric_sum strata_mirror_repairs_total 'kind="read"') - read_repairs0))
log "every file read: $bad_reads2 wrong; $read_repairs blocks healed by reads"

scrub2_rc=0
"$bin" scrub --repair --json --rate "$SCRUB_RATE" --meta "$meta" --key-file "$D/cluster.key" >"$work/scrub-repair.json" 2>"$work/scrub-repair.err" || scrub2_rc=$?
read -r s2_bad s2_rep s2_unrep s2_mism _ s2_done <<<"$(scrub_totals "$work/scrub-repair.json")"
scrub3_rc=0
"$bin" scrub --json --rate "$SCRUB_RATE" --meta "$meta" --key-file "$D/cluster.key" >"$work/scrub-verify.json" 2>"$work/scrub-verify.err" || scrub3_rc=$?
read -r s3_bad _ s3_unrep s3_mism s3_missing s3_done <<<"$(scrub_totals "$work/scrub-verify.json")"
repairs=$(($(metric_sum strata_mirror_repairs_total) - repairs0))

# Each flipped block, read from both copies' files directly.
differ=$(python3 - "$sec_path" "$pri_path" "$work/flips.txt" <<'EOF'
import os, sys
sec, pri, flips = sys.argv[1], sys.argv[2], sys.argv[3]
bad = 0
for line in open(flips):
    p, blk = line.split()
    off = int(blk) * 4096
    q = os.path.join(pri, os.path.relpath(p, sec))
    with open(p, "rb") as a, open(q, "rb") as b:
        a.seek(off); b.seek(off)
        if a.read(4096) != b.read(4096):
            bad += 1
print(bad)
EOF
)

repair_ok=1
((bad_reads2 == 0 && scrub2_rc == 0 && s2_unrep == 0 && scrub3_rc == 0 && s3_bad == 0 && s3_mism == 0 && s3_missing == 0 && differ == 0)) || repair_ok=0
{
  echo "REPAIR  $FLIPS blocks flipped in $sec_path (group $G's secondary); files read wrong=$bad_reads2; blocks healed by those reads=$read_repairs"
  echo "REPAIR  scrub --repair: exit=$scrub2_rc bad_blocks=$s2_bad repaired=$s2_rep unrepairable=$s2_unrep mismatched=$s2_mism targets_scrubbed=$s2_done"
  echo "REPAIR  scrub after:    exit=$scrub3_rc bad_blocks=$s3_bad unrepairable=$s3_unrep mismatched=$s3_mism peer_missing=$s3_missing targets_scrubbed=$s3_done"
  echo "REPAIR  strata_mirror_repairs_total +$repairs; flipped blocks still differing from the other copy on disk=$differ"
  echo "REPAIR  bar (every read right, one scrub --repair leaves both copies verified): $([[ $repair_ok == 1 ]] && echo MET || echo FAILED)"
} | tee -a "$summary"

[[ $resync_ok == 1 && $repair_ok == 1 ]] || exit 1
