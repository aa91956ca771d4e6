#!/usr/bin/env bash
# The fio patterns of the core issue's bars, run on one directory:
#   sequential 1 MiB, 4 jobs x 512 MiB, end_fsync (write), then read after dropping caches;
#   random 4 KiB, 4 jobs x 256 MiB, 15 s, O_DIRECT (write, then read);
# and the metadata pattern (4 processes x 5,000 empty files in their own directories:
# create, stat, remove) through `strata bench --workloads meta`.
# Usage (as root): scripts/fio-bars.sh DIR LABEL [STRATA_BIN]   — prints one line per figure.
set -euo pipefail
dir=$1 label=$2 bin=${3:-./strata}
work="$dir/fio-bars.$$"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
fio_val() { # fio --output-format=json on stdin -> bandwidth MiB/s or IOPS
  python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; k=sys.argv[1]; m=sys.argv[2]
print(round(j[k]["bw"]/1024) if m=="bw" else round(j[k]["iops"]))' "$1" "$2"
}
common=(--directory="$work" --numjobs=4 --ioengine=psync --group_reporting --output-format=json)
drop
w=$(fio --name=seq "${common[@]}" --rw=write --bs=1M --size=512M --end_fsync=1 | fio_val write bw)
drop
r=$(fio --name=seq "${common[@]}" --rw=read --bs=1M --size=512M | fio_val read bw)
rm -f "$work"/seq.*
drop
rw=$(fio --name=rnd "${common[@]}" --rw=randwrite --bs=4k --size=256M --direct=1 --time_based --runtime=15 | fio_val write iops)
drop
rr=$(fio --name=rnd "${common[@]}" --rw=randread --bs=4k --size=256M --direct=1 --time_based --runtime=15 | fio_val read iops)
rm -f "$work"/rnd.*
meta_json="$work/meta.json"
"$bin" bench --workloads meta --threads 4 --files-per-dir 5000 --dirs-per-thread 1 --meta-sync=false \
  --fio=false --json "$meta_json" --out "$work/meta-out" "$work" >/dev/null 2>&1
read -r c s d < <(python3 -c 'import json,sys
r={x["phase"]:round(x["value"]) for x in json.load(open(sys.argv[1]))["results"]}
print(r["create"], r["stat"], r["remove"])' "$meta_json")
printf '%-12s seq_write_MiBs=%s seq_read_MiBs=%s rand_write_iops=%s rand_read_iops=%s create_s=%s stat_s=%s remove_s=%s\n' \
  "$label" "$w" "$r" "$rw" "$rr" "$c" "$s" "$d"
