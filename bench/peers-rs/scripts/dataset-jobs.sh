#!/usr/bin/env bash
# Writes a worker job file (bench/README.md) for every message of the
# HyperProtoBench and social-network datasets, from their manifest.tsv files.
#
# usage: scripts/dataset-jobs.sh [DATASETS_DIR] > jobs.tsv
# DATASETS_DIR defaults to the shared/datasets directory beside the checkout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "${1:-$here/../../../../shared/datasets}" && pwd)

hpb="$root/hyperprotobench"
if [[ -f "$hpb/manifest.tsv" ]]; then
  # columns: bench message type bytes ... path (last)
  awk -F'\t' -v OFS='\t' -v dir="$hpb" 'NR > 1 {
    print "hyperprotobench", $1, "hyperprotobench/" $1, $3, $2, "single", dir "/" $NF
  }' "$hpb/manifest.tsv"
fi

social="$root/socialnetwork"
if [[ -f "$social/manifest.tsv" ]]; then
  # columns: type count avg_bytes min_bytes max_bytes path
  awk -F'\t' -v OFS='\t' -v dir="$social" 'NR > 1 {
    name = $1; sub(/.*\./, "", name)
    print "socialnetwork", "socialnetwork", "socialnetwork", $1, name, "delimited", dir "/" $NF
  }' "$social/manifest.tsv"
fi
