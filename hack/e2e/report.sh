#!/usr/bin/env bash
# report.sh: the results of the last make e2e runs (_output/e2e, or
# E2E_OUT), as docs/e2e.md shows them: the table of every test with each
# proxier, then for each kpng proxier the tests that kube-proxy passed in
# the same mode and it did not. Exits 1 if there is one. kpng-userspace
# has a column of the table and no comparison: kube-proxy has no userspace
# mode any more, and its failures are recorded with their reasons.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${E2E_OUT:-${root}/_output/e2e}"
dirs=()
for p in kube-proxy-nftables kpng-nft kube-proxy-iptables kpng-iptables kpng-userspace; do
  [[ -s "${out}/${p}/junit.xml" ]] && dirs+=("${out}/${p}")
done
((${#dirs[@]} > 0)) || { echo "report.sh: no reports in ${out}: run make e2e first" >&2; exit 1; }
report() { go run -C "${root}" ./hack/cmd/kpng-e2e-report "$@"; }
report --table "${dirs[@]}"
echo
echo "| Skipped (a regular expression) | why |"
echo "|---|---|"
grep -v -e '^#' -e '^$' "${root}/hack/e2e/skips.txt" | while IFS=$'\t' read -r re why; do
  echo "| \`${re//|/\\|}\` | ${why} |"
done
echo
rc=0
for pair in kube-proxy-nftables:kpng-nft kube-proxy-iptables:kpng-iptables; do
  base="${out}/${pair%%:*}" other="${out}/${pair#*:}"
  [[ -s "${base}/junit.xml" && -s "${other}/junit.xml" ]] || continue
  report --compare "${base}" "${other}" || rc=1
done
exit "${rc}"
