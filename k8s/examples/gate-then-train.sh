#!/bin/sh
# The gate, then training: run the busbw gate job, wait for its verdict, then submit the
# training job, whose nodeSelector admits only nodes the gate labelled.
#   k8s/examples/gate-then-train.sh [NAMESPACE]
# Exit: 0 training submitted; 3 the gate failed (some nodes were unlabelled; see the log of
# busbw-gate-rank-0); 4 the gate did not finish in time.
set -eu
ns=${1:-default}
here=$(dirname "$0")
kubectl -n "$ns" delete jobs.batch.volcano.sh busbw-gate --ignore-not-found --wait=true
kubectl -n "$ns" apply -k "$here/gate"
deadline=$(( $(date +%s) + ${GATE_TIMEOUT:-3600} ))
while :; do
  phase=$(kubectl -n "$ns" get jobs.batch.volcano.sh busbw-gate -o 'jsonpath={.status.state.phase}' 2>/dev/null || true)
  case "$phase" in
    Completed) break ;;
    Failed|Aborted|Terminated)
      echo "gate: $phase; nodes the verdict named lost busbw.dev/fabric-ok:" >&2
      kubectl -n "$ns" logs busbw-gate-rank-0 | grep -E '^# (Verdict|  suspect|label-nodes)' >&2 || true
      exit 3 ;;
  esac
  [ "$(date +%s)" -lt "$deadline" ] || { echo "gate: not finished (phase '$phase')" >&2; exit 4; }
  sleep 10
done
kubectl get nodes -l busbw.dev/fabric-ok=true
kubectl -n "$ns" apply -f "$here/train-after-gate.yaml"
