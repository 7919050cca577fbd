//! Byte-exact comparisons against text produced by nccl-tests' own format
//! strings (cross-checked with a printf oracle), trailing spaces included.

use std::io::{self, Write};

use busbw_reports::{
    busbw_average, Cell, DeviceInfo, Footer, Row, RunHeader, Sink, Step, TextTable,
};

fn header() -> RunHeader {
    RunHeader {
        program: "all_reduce_perf".into(),
        version_line: "nccl-tests version 2.19.6 busbw=0.1.0 transport=tcp".into(),
        nthreads: 1,
        ngpus: 1,
        min_bytes: 8,
        max_bytes: 134_217_728,
        step: Step::Factor(2),
        warmup_iters: 1,
        iters: 20,
        agg_iters: 1,
        validation: 1,
        graph: 0,
        unalign: 0,
        devices: vec![
            DeviceInfo {
                rank: 0,
                group: 0,
                pid: 12345,
                hostname: "node01".into(),
                device: 0,
                pci: "0000:07:00".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
            },
            DeviceInfo {
                rank: 1,
                group: 0,
                pid: 7,
                hostname: "gpu-node-17.cluster.example.com".into(),
                device: 1,
                pci: "0000:0a:00".into(),
                name: "busbw CPU".into(),
            },
        ],
        extra_columns: vec![],
        per_iter: None,
        cputime: false,
        timestamps: false,
        blocking: 0,
        parallel_init: false,
        data_path: None,
    }
}

fn cell(time_us: f64, algbw: f64, busbw: f64, wrong: Option<u64>) -> Cell {
    Cell {
        time_us,
        algbw,
        busbw,
        wrong,
    }
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            size: 8,
            count: 2,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: cell(12.34, 0.00065, 0.00113, Some(0)),
            in_place: cell(12.1, 0.00066, 0.00116, Some(0)),
            extra: vec![],
        },
        Row {
            size: 134_217_728,
            count: 33_554_432,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: cell(1234.5, 108.72, 190.26, Some(0)),
            in_place: cell(1230.1, 109.11, 190.94, Some(0)),
            extra: vec![],
        },
        Row {
            size: 1_073_741_824,
            count: 268_435_456,
            dtype: "bfloat16".into(),
            redop: "none".into(),
            root: 0,
            out_of_place: cell(12_345_678.0, 0.087, 1_234_567.0, Some(1_048_576)),
            in_place: cell(123_456.7, 12_345.4, 0.125, None),
            extra: vec![],
        },
    ]
}

fn footer() -> Footer {
    Footer {
        program: "all_reduce_perf".into(),
        out_of_bounds: 0,
        avg_busbw: 12.3456,
        min_busbw: None,
        error: None,
        memory: None,
    }
}

const GOLDEN: &str = concat!(
    "# nccl-tests version 2.19.6 busbw=0.1.0 transport=tcp\n",
    "# Collective test starting: all_reduce_perf\n",
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n",
    "#\n",
    "# Using devices\n",
    "#  Rank  0 Group  0 Pid  12345 on     node01 device  0 [0000:07:00] NVIDIA H100 80GB HBM3\n",
    "#  Rank  1 Group  0 Pid      7 on gpu-node-17.cluster.example.com device  1 [0000:0a:00] busbw CPU\n",
    "#\n",
    "#                                                              out-of-place                       in-place          \n",
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         \n",
    "           8             2     float     sum      -1    12.34    0.00    0.00       0    12.10    0.00    0.00       0\n",
    "   134217728      33554432     float     sum      -1  1234.50  108.72  190.26       0  1230.10  109.11  190.94       0\n",
    "  1073741824     268435456  bfloat16    none       0  1.2e+07    0.09   1e+06  1.04858e+06   123457   12345    0.12    N/A\n",
    "# Out of bounds values : 0 OK\n",
    "# Avg bus bandwidth    : 12.3456 \n",
    "#\n",
    "# Collective test concluded: all_reduce_perf\n",
    "#\n",
    "\n",
);

fn render(h: &RunHeader, rows: &[Row], f: &Footer) -> String {
    let mut t = TextTable::new(Vec::new());
    t.header(h).expect("write to Vec");
    for r in rows {
        t.row(r).expect("write to Vec");
    }
    t.footer(f).expect("write to Vec");
    String::from_utf8(t.into_inner()).expect("table is UTF-8")
}

/// Shows the first differing line instead of two walls of text.
fn assert_same(got: &str, want: &str) {
    for (i, (g, w)) in got.split('\n').zip(want.split('\n')).enumerate() {
        assert_eq!(g, w, "line {} differs", i + 1);
    }
    assert_eq!(got, want);
}

#[test]
fn full_report_is_byte_exact() {
    assert_same(&render(&header(), &rows(), &footer()), GOLDEN);
}

#[test]
fn column_lines_are_119_bytes_and_rows_118() {
    let text = render(&header(), &rows(), &footer());
    let lines: Vec<&str> = text.split('\n').collect();
    assert_eq!(lines[8].len(), 116);
    assert_eq!(lines[9].len(), 119);
    assert_eq!(lines[10].len(), 119);
    assert_eq!(lines[11].len(), 118);
    assert_eq!(lines[12].len(), 118);
}

/// Device rows say where their bytes went, in the header and in the JSON record, so a
/// staged figure is never read as a GPU figure; host rows keep nccl-tests' header.
#[test]
fn the_data_path_of_device_rows_is_named() {
    let plain = render(&header(), &rows(), &footer());
    assert!(!plain.contains("Data path"), "{plain}");
    let mut h = header();
    h.data_path = Some("NCCL 2.32.3 (libnccl.so.2), device buffers".into());
    let text = render(&h, &rows(), &footer());
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("# Data path: NCCL 2.32.3 (libnccl.so.2), device buffers"))
        .expect("the data path line");
    assert_eq!(lines[at + 1], "#", "before the device list: {text}");
    let json = serde_json::to_string(&h).unwrap();
    assert!(
        json.contains(r#""data_path":"NCCL 2.32.3 (libnccl.so.2), device buffers""#),
        "{json}"
    );
    assert!(!serde_json::to_string(&header())
        .unwrap()
        .contains("data_path"));
    let back: RunHeader = serde_json::from_str(&json).unwrap();
    assert_eq!(back.data_path, h.data_path);
}

#[test]
fn bytes_step_and_gated_failed_footer() {
    let mut h = header();
    h.step = Step::Bytes(1_048_576);
    h.devices.clear();
    let f = Footer {
        program: "alltoall_perf".into(),
        out_of_bounds: 2,
        avg_busbw: 1_048_576.0,
        min_busbw: Some(2_000_000.0),
        error: Some("remote process exited".into()),
        memory: None,
    };
    let want = concat!(
        "# nccl-tests version 2.19.6 busbw=0.1.0 transport=tcp\n",
        "# Collective test starting: all_reduce_perf\n",
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 1048576(bytes) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n",
        "#\n",
        "# Using devices\n",
        "#\n",
        "#                                                              out-of-place                       in-place          \n",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         \n",
        "# Out of bounds values : 2 FAILED\n",
        "# Avg bus bandwidth    : 1.04858e+06 FAILED\n",
        "#\n",
        "# Collective test concluded: alltoall_perf\n",
        "#\n",
        "# error: remote process exited\n",
    );
    assert_same(&render(&h, &[], &f), want);
}

#[test]
fn gate_passes_within_ten_percent() {
    let f = Footer {
        avg_busbw: 95.5,
        min_busbw: Some(100.0),
        ..footer()
    };
    let text = render(&header(), &[], &f);
    assert!(
        text.contains("\n# Avg bus bandwidth    : 95.5 OK\n"),
        "{text}"
    );
}

#[test]
fn multi_line_error_stays_commented() {
    let f = Footer {
        error: Some("first\nsecond".into()),
        ..footer()
    };
    let text = render(&header(), &[], &f);
    assert!(text.ends_with("#\n# error: first\n# second\n"), "{text}");
}

#[test]
fn unvalidated_out_of_place_prints_na() {
    let r = Row {
        size: 0,
        count: 0,
        dtype: "int8".into(),
        redop: "none".into(),
        root: 3,
        out_of_place: cell(0.0, 0.0, 0.0, None),
        in_place: cell(0.5, 0.0, 0.0, Some(3)),
        extra: vec![],
    };
    let mut t = TextTable::new(Vec::new());
    t.row(&r).expect("write to Vec");
    assert_eq!(
        String::from_utf8(t.into_inner()).expect("UTF-8"),
        "           0             0      int8    none       3     0.00    0.00    0.00    N/A     0.50    0.00    0.00       3\n"
    );
}

/// Counts flushes so we can prove every line reaches the OS immediately.
#[derive(Default)]
struct FlushCounter {
    data: Vec<u8>,
    flushed_at: Vec<usize>,
}

impl Write for FlushCounter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.flushed_at.push(self.data.len());
        Ok(())
    }
}

#[test]
fn flushes_after_every_line() {
    let mut t = TextTable::new(FlushCounter::default());
    t.header(&header()).expect("infallible writer");
    for r in &rows() {
        t.row(r).expect("infallible writer");
    }
    t.footer(&footer()).expect("infallible writer");
    let w = t.into_inner();
    let line_ends: Vec<usize> = w
        .data
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == b'\n')
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(w.flushed_at, line_ends);
}

struct FailingWriter;

impl Write for FailingWriter {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(io::ErrorKind::BrokenPipe, "closed"))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn write_errors_propagate() {
    let mut t = TextTable::new(FailingWriter);
    let err = t.row(&rows()[0]).expect_err("writer fails");
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
}

#[test]
fn sink_works_through_dyn_box_and_mut_ref() {
    let mut table = TextTable::new(Vec::new());
    {
        let mut boxed: Box<dyn Sink + '_> = Box::new(&mut table);
        boxed.row(&rows()[0]).expect("write to Vec");
    }
    assert!(table.get_ref().starts_with(b"           8 "));
}

#[test]
fn average_covers_both_placements_of_every_row() {
    assert_eq!(busbw_average(&[]), 0.0);
    let rs = rows();
    let want = (0.00113 + 0.00116 + 190.26 + 190.94 + 1_234_567.0 + 0.125) / 6.0;
    assert!((busbw_average(&rs) - want).abs() < 1e-9);
    assert_eq!(busbw_average(&rs[1..2]), (190.26 + 190.94) / 2.0);
}

#[test]
fn records_are_serde_types() {
    fn assert_serde<T: serde::Serialize + for<'de> serde::Deserialize<'de>>() {}
    assert_serde::<RunHeader>();
    assert_serde::<Row>();
    assert_serde::<Footer>();
}

/// `--algo auto` appends a column; the rest of each line is unchanged.
#[test]
fn extra_columns_follow_the_nccl_tests_columns() {
    let mut h = header();
    h.devices.truncate(1);
    h.extra_columns = vec!["algo".into()];
    let mut r = rows().remove(0);
    r.extra = vec!["tree".into()];
    let mut t = TextTable::new(Vec::new());
    t.header(&h).expect("write");
    t.row(&r).expect("write");
    let text = String::from_utf8(t.into_inner()).expect("UTF-8");
    let lines: Vec<&str> = text.lines().collect();
    let n = lines.len();
    assert_eq!(
        lines[n - 3],
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong    algo"
    );
    assert_eq!(
        lines[n - 2],
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)                "
    );
    let plain = {
        let mut t = TextTable::new(Vec::new());
        r.extra.clear();
        t.row(&r).expect("write");
        String::from_utf8(t.into_inner()).expect("UTF-8")
    };
    assert_eq!(lines[n - 1], format!("{}    tree", plain.trim_end()));
}

/// `-I 1 -K 1 -C 1 -S 1`: the column lines nccl-tests' `writeResultHeader` prints (its format
/// strings through a printf oracle), the per-iteration report line after the nThread line, and
/// rows with the four per-iteration columns of each placement computed over the iterations
/// after the first.
#[test]
fn per_iteration_cputime_and_timestamp_columns() {
    let mut h = header();
    h.per_iter = Some(1);
    h.cputime = true;
    h.timestamps = true;
    let lines = busbw_reports::table::header_lines(&h);
    assert_eq!(
        lines[3],
        "# Per-Iteration Report: host clock timing; i_* uses max over process rows; summary \
         skips first 1 iterations "
    );
    assert_eq!(lines[4], "#");
    let n = lines.len();
    assert_eq!(
        lines[n - 3],
        "#                                                                 out-of-place (+ per-iteration)                                in-place (+ per-iteration)"
    );
    assert_eq!(
        lines[n - 2],
        "#       size         count      type   redop    root  cputime   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%  cputime   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%           timestamp"
    );
    assert_eq!(
        lines[n - 1],
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)     (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)   %Y-%m-%d %H:%M:%S"
    );
    let r = Row {
        size: 1024,
        count: 256,
        dtype: "float".into(),
        redop: "sum".into(),
        root: -1,
        out_of_place: cell(12.5, 0.08, 0.08, Some(0)),
        in_place: cell(5.0, 0.2, 0.2, Some(0)),
        extra: vec![],
    };
    let line = busbw_reports::table::row_line_with(
        &r,
        Some((1, [&[1000.0, 10.0, 20.25][..], &[9.0, 5.0, 5.0][..]])),
        Some("2026-12-01 22:10:15"),
    );
    assert_eq!(
        line,
        "        1024           256     float     sum      -1    12.50    0.08    0.08       0    10.00    20.25    20.25    33.88     5.00    0.20    0.20       0     5.00     5.00     5.00     0.00  2026-12-01 22:10:15"
    );
    // Without -I, the timestamp follows the in-place #wrong (`%21s`).
    let plain = busbw_reports::table::row_line_with(&r, None, Some("2026-12-01 22:10:15"));
    assert_eq!(
        plain,
        format!(
            "{}  2026-12-01 22:10:15",
            busbw_reports::table::row_line(&r)
        )
    );
}

/// `-z 3 -p 1 -M 1`: nccl-tests' header lines in its order (blocking, per-iteration, parallel
/// init) and the memory line between "concluded" and the closing `#`, in its units.
#[test]
fn blocking_parallel_init_and_memory_lines() {
    let mut h = header();
    h.devices.clear();
    h.blocking = 3;
    h.parallel_init = true;
    h.per_iter = Some(0);
    let lines = busbw_reports::table::header_lines(&h);
    assert_eq!(
        lines[3..6],
        [
            "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier ",
            "# Per-Iteration Report: host clock timing; i_* uses max over process rows ",
            "# Parallel Init Enabled: threads call into NcclInitRank concurrently ",
        ]
    );
    for (z, want) in [
        (
            1,
            "# Blocking Enabled: wait and barrier after each inner iteration (-m) ",
        ),
        (
            2,
            "# Blocking Enabled: wait after each inner iteration (-m), no barrier ",
        ),
    ] {
        h.blocking = z;
        assert_eq!(busbw_reports::table::header_lines(&h)[3], want);
    }
    h.blocking = 0;
    h.parallel_init = false;
    h.per_iter = None;
    assert_eq!(busbw_reports::table::header_lines(&h)[3], "#");

    let f = Footer {
        memory: Some(busbw_reports::MemoryUsage {
            kind: "GPU".into(),
            initialization: 1_610_612_736,
            user_allocated: 50 * 1024 * 1024 + 512 * 1024,
            collective: 0,
        }),
        ..footer()
    };
    let text = render(&header(), &[], &f);
    assert!(
        text.ends_with(
            "# Collective test concluded: all_reduce_perf\n\
             # GPU memory usage     : Initialization 1.50 GB | User-Allocated 50.5 MB | \
             Collective 0.00 B | Total  1.55 GB\n#\n\n"
        ),
        "{text}"
    );
    assert_eq!(busbw_reports::table::mem_string(300 * 1024), "300 KB");
    assert_eq!(busbw_reports::table::mem_string(-2048), "-2.00 KB");
}
