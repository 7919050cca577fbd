#!/bin/sh
# Regenerate every rendered manifest under k8s/ with the busbw binary given as $1 (default:
# the debug build). Each file's first line names the command that made it; the test
# bench/tests/k8s.rs renders them again and fails when a file and the renderer disagree.
set -eu
cd "$(dirname "$0")"
busbw=${1:-../target/debug/busbw}
render() {
    out=$1
    shift
    mkdir -p "$(dirname "$out")"
    "$busbw" k8s render "$@" >"$out.tmp"
    mv "$out.tmp" "$out"
}
render rbac/rbac.yaml --scheduler volcano --part rbac
render rbac-labeler/rbac.yaml --scheduler volcano --part labeler-rbac
render volcano/job.yaml --scheduler volcano --part job
render volcano-pytorch/job.yaml --scheduler volcano --pytorch --name busbw-gate-pt --part job
render kueue-jobset/jobset.yaml --scheduler kueue --part job \
    --topology-level oci.oraclecloud.com/rdma.network_block_id --topology-preferred
render mpi-operator/mpijob.yaml --scheduler mpi --part job
render nightly/nightly.yaml --scheduler volcano --nightly --part job --report-pvc busbw-results \
    --push-gateway http://pushgateway.monitoring.svc:9091
render examples/gate/gate.yaml --scheduler volcano --part job --label-nodes busbw.dev/fabric-ok=true
