#!/usr/bin/env bash
# fuzz.sh: run every libFuzzer target in fuzz/ for a while and report executions and crashes.
#
#   bench/scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     default 180 s, every target
#
# With cargo-fuzz installed it is used (`cargo +nightly fuzz run`); without, the targets are
# built with the same instrumentation flags cargo-fuzz passes (nightly rustc's sancov pass and
# libfuzzer-sys), so only a nightly toolchain is needed. Crashing inputs are kept under
# fuzz/artifacts/<target>/, the growing corpus under fuzz/corpus/<target>/. Without nightly
# the script says so and runs the stable twins (the crates' random/mutated-input unit tests).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-180}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(store_request data_hello run_record)

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: no nightly toolchain: running the stable twins instead" >&2
    exec nice -n 19 cargo test -p busbw-launchers -p busbw-transports -p busbw-reports --lib \
        -- random_and_mutated mutated_reports
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
if cargo +nightly fuzz --version >/dev/null 2>&1; then
    run() { (cd fuzz && nice -n 19 cargo +nightly fuzz run "$1" -- -max_total_time="$secs" "${@:2}"); }
else
    export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
    (cd fuzz && nice -n 19 cargo +nightly build --release --target "$triple" --bins)
    run() {
        mkdir -p "fuzz/corpus/$1" "fuzz/artifacts/$1"
        nice -n 19 "fuzz/target/$triple/release/$1" -max_total_time="$secs" \
            -artifact_prefix="fuzz/artifacts/$1/" "fuzz/corpus/$1" "${@:2}"
    }
fi

status=0
for t in "${targets[@]}"; do
    log=$(mktemp)
    if run "$t" >"$log" 2>&1; then rc=0; else rc=$?; fi
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)
    [[ -n $execs ]] || execs=$(grep -Eo '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    crashes=$(find "fuzz/artifacts/$t" -type f 2>/dev/null | wc -l)
    echo "fuzz.sh: $t: ${secs} s, ${execs:-?} executions, exit $rc, $crashes input(s) in fuzz/artifacts/$t"
    if ((rc != 0)); then
        tail -30 "$log" >&2
        status=1
    fi
    rm -f "$log"
done
exit $status
