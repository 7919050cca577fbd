//! A fixed two-rank run for the exporters' golden tests.

use crate::record::{
    Cell, DeviceInfo, Footer, PairwiseRecord, Row, RunHeader, SlowLink, Step, TierRecord, TierRow,
    TiersRecord, VerdictRecord,
};
use crate::run::*;

fn cell(time: f64, bw: f64, per_rank: [[f64; 4]; 2], wrong: Option<u64>) -> CellRecord {
    let times: Vec<f64> = (0..4).map(|i| per_rank[0][i].max(per_rank[1][i])).collect();
    let means: Vec<f64> = per_rank
        .iter()
        .map(|r| r.iter().sum::<f64>() / 4.0)
        .collect();
    CellRecord {
        time_us: time,
        time_min_us: means[0].min(means[1]),
        time_max_us: means[0].max(means[1]),
        algbw: bw,
        busbw: bw,
        wrong,
        iterations: IterStats::from_samples(&times, per_rank.iter().map(|r| r.to_vec()).collect()),
    }
}

pub fn devices() -> Vec<DeviceInfo> {
    (0..2)
        .map(|r| DeviceInfo {
            rank: r,
            group: 0,
            pid: 4000 + r as u32,
            hostname: "node-a".into(),
            device: r as i32,
            pci: "0000:00:00".into(),
            name: "host memory via tcp".into(),
        })
        .collect()
}

pub fn run() -> RunRecord {
    RunRecord {
        complete: true,
        schema: SCHEMA.into(),
        schema_version: SCHEMA_VERSION,
        versions: Versions {
            busbw: "0.1.0".into(),
            nccl_tests: "2.19.6".into(),
        },
        program: "all_reduce_perf".into(),
        args: "busbw all_reduce_perf --np 2 -b 1K -e 1M -f 1024 -n 4 --job-token ***"
            .split(' ')
            .map(String::from)
            .collect(),
        start_time: "2026-12-01T08:00:00Z".into(),
        end_time: Some("2026-12-01T08:00:05Z".into()),
        plan: PlanRecord {
            min_bytes: 1024,
            max_bytes: 1 << 20,
            step: Step::Factor(1024),
            warmup_iters: 1,
            iters: 4,
            agg_iters: 1,
            check: 1,
            dtypes: vec!["float".into()],
            ops: vec!["sum".into()],
            root: 0,
            algo: Some("ring".into()),
            average: "mean".into(),
            cycles: 1,
            timeout_s: 300,
            min_busbw: None,
            link_rate_gbps: Some(2.0),
            per_iter_skip: 0,
            cputime: false,
            blocking: 0,
            unalign: 0,
            rotate: Some("16M".into()),
            parallel_init: false,
        },
        world: WorldRecord {
            ranks: 2,
            hosts: vec!["node-a".into()],
            labels: Default::default(),
            transports: vec!["tcp".into()],
            devices: devices(),
        },
        rows: vec![
            RowRecord {
                size: 1024,
                count: 256,
                dtype: "float".into(),
                redop: "sum".into(),
                root: -1,
                algo: Some("ring".into()),
                out_of_place: cell(
                    20.0,
                    0.0512,
                    [[19.0, 20.0, 21.0, 20.0], [20.0, 19.0, 20.0, 21.0]],
                    Some(0),
                ),
                in_place: cell(
                    21.5,
                    0.047628,
                    [[21.0, 22.0, 21.0, 20.0], [22.0, 21.0, 22.0, 21.0]],
                    Some(0),
                ),
            },
            RowRecord {
                size: 1 << 20,
                count: 1 << 18,
                dtype: "float".into(),
                redop: "sum".into(),
                root: -1,
                algo: Some("ring".into()),
                out_of_place: cell(
                    700.0,
                    1.497966,
                    [[690.0, 700.0, 710.0, 700.0], [700.0, 690.0, 700.0, 710.0]],
                    Some(0),
                ),
                in_place: cell(
                    690.0,
                    1.519675,
                    [[680.0, 690.0, 700.0, 690.0], [690.0, 680.0, 690.0, 700.0]],
                    Some(0),
                ),
            },
        ],
        summary: Some(SummaryRecord {
            out_of_bounds: 0,
            avg_busbw: 1.5,
            min_busbw: None,
            bandwidth_ok: None,
            error: None,
        }),
        tiers: None,
        pairwise: None,
        verdict: None,
        tier_report: None,
    }
}

/// The same run measured with two topology tiers, a pairwise matrix and a verdict.
pub fn run_with_tiers() -> RunRecord {
    let mut r = run();
    r.tiers = Some(TiersRecord {
        tiers: vec![
            TierRecord {
                name: "same-rack".into(),
                collective: "all_reduce_perf".into(),
                groups: 2,
                link_rate_gbps: Some(2.0),
                rows: vec![
                    TierRow {
                        size: 1024,
                        time_us: 19.0,
                        algbw: 0.054,
                        busbw: 0.054,
                    },
                    TierRow {
                        size: 1 << 20,
                        time_us: 650.0,
                        algbw: 1.61,
                        busbw: 1.61,
                    },
                ],
                verdict: Some(VerdictRecord {
                    pass: true,
                    reason: "1.61 GB/s >= 0.8 x 2 GB/s".into(),
                    findings: Vec::new(),
                }),
            },
            TierRecord {
                name: "cross-rack".into(),
                collective: "all_reduce_perf".into(),
                groups: 1,
                link_rate_gbps: Some(1.0),
                rows: vec![
                    TierRow {
                        size: 1024,
                        time_us: 40.0,
                        algbw: 0.0256,
                        busbw: 0.0256,
                    },
                    TierRow {
                        size: 1 << 20,
                        time_us: 2000.0,
                        algbw: 0.52,
                        busbw: 0.52,
                    },
                ],
                verdict: Some(VerdictRecord {
                    pass: false,
                    reason: "0.52 GB/s < 0.8 x 1 GB/s".into(),
                    findings: Vec::new(),
                }),
            },
        ],
    });
    r.pairwise = Some(PairwiseRecord {
        nodes: vec!["node-a".into(), "node-b".into(), "node-c".into()],
        size: 1 << 20,
        busbw: vec![
            vec![None, Some(1.9), Some(0.4)],
            vec![Some(1.9), None, Some(1.8)],
            vec![Some(0.4), Some(1.8), None],
        ],
        slow: vec![SlowLink {
            a: 0,
            b: 2,
            reason: "0.4 GB/s, 21% of the median".into(),
        }],
    });
    let finding = |kind, subject: &str, detail: &str| crate::tiers::Finding {
        kind,
        subject: subject.into(),
        detail: detail.into(),
    };
    use crate::tiers::FindingKind as K;
    r.verdict = Some(VerdictRecord {
        pass: false,
        reason: "tier cross-rack failed".into(),
        findings: vec![
            finding(
                K::SlowLink,
                "node-a - node-c",
                "slow link node-a - node-c (tier cross-rack): 0.4 GB/s, expected 1.85 GB/s",
            ),
            finding(
                K::Straggler,
                "node-b",
                "straggler node-b: 3 of 12 iterations spiked (25%), with 2 of 2 partners",
            ),
            finding(
                K::TierUnderThreshold,
                "cross-rack",
                "tier cross-rack below its threshold: 0.52 GB/s",
            ),
        ],
    });
    r
}

pub fn header() -> RunHeader {
    RunHeader {
        program: "all_reduce_perf".into(),
        version_line: "nccl-tests version 2.19.6 busbw-version=0.1.0 transport=tcp".into(),
        nthreads: 1,
        ngpus: 1,
        min_bytes: 1024,
        max_bytes: 1 << 20,
        step: Step::Factor(1024),
        warmup_iters: 1,
        iters: 4,
        agg_iters: 1,
        validation: 1,
        graph: 0,
        unalign: 0,
        devices: devices(),
        extra_columns: vec![],
        per_iter: None,
        cputime: false,
        timestamps: false,
        blocking: 0,
        parallel_init: false,
        data_path: None,
    }
}

pub fn footer() -> Footer {
    Footer {
        program: "all_reduce_perf".into(),
        out_of_bounds: 0,
        avg_busbw: 1.5,
        min_busbw: None,
        error: None,
        memory: None,
    }
}

/// What the harness would have handed the sink for `r`.
pub fn measured(r: &RowRecord) -> Measured {
    let c = |c: &CellRecord| Cell {
        time_us: c.time_us,
        algbw: c.algbw,
        busbw: c.busbw,
        wrong: c.wrong,
    };
    let d = |c: &CellRecord| CellDetail {
        time_min_us: c.time_min_us,
        time_max_us: c.time_max_us,
        iterations: c.iterations.clone(),
    };
    Measured {
        row: Row {
            size: r.size,
            count: r.count,
            dtype: r.dtype.clone(),
            redop: r.redop.clone(),
            root: r.root,
            out_of_place: c(&r.out_of_place),
            in_place: c(&r.in_place),
            extra: vec![],
        },
        out_of_place: d(&r.out_of_place),
        in_place: d(&r.in_place),
        algo: r.algo.clone(),
    }
}

/// Compares `got` with the golden file `name` under `reports/tests/golden/`;
/// `BUSBW_UPDATE_GOLDEN=1` rewrites it instead.
pub fn golden(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("BUSBW_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (BUSBW_UPDATE_GOLDEN=1 creates it)", path.display()));
    assert!(
        want == got,
        "{name} differs from {}; rerun with BUSBW_UPDATE_GOLDEN=1 if the change is intended\n--- got:\n{got}",
        path.display()
    );
}
