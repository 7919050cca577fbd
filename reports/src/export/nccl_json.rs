//! `-J FILE.json`: nccl-tests' JSON document, version 3, for tools that already parse it
//! (`tools/analyze_perf_json.py`, dashboards written against nccl-tests).
//!
//! Layout, key order and quirks follow nccl-tests' `util.cu`: booleans as the strings
//! `"true"`/`"false"`, doubles printed `%lf` (six decimals), NaN as `"nan"`, `root` as a
//! six-wide string, `nwrong` as a double or `null`. Two deliberate differences: `env` is an
//! empty list (nccl-tests dumps the whole environment, secrets included), and the per-iteration
//! blocks (`*_per_iter`, which nccl-tests writes with `-I 1`) are always present because busbw
//! always times each iteration; `config.per_iter_timing` says so. `nccl_version` is 0: no NCCL
//! is involved. Until the run ends the document has no footer keys and no `end_time`, which is
//! how readers recognise a partial run.

use crate::clock;
use crate::record::Step;
use crate::run::{CellRecord, IterStats, RunRecord};
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

/// nccl-tests' `JSON_FILE_VERSION`.
pub const VERSION: u32 = 3;

/// Whether nccl-tests would write JSON to `path` (extension `.json`, any case).
pub fn accepts(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// nccl-tests never overwrites: it opens `path` exclusively, else `path.0`, `path.1`, … and
/// writes to the first that did not exist. The file is created here so that two runs started
/// together cannot pick the same name.
pub fn reserve(path: &Path) -> io::Result<PathBuf> {
    let mut candidate = path.to_path_buf();
    for i in 0..u32::MAX {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(_) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                candidate = PathBuf::from(format!("{}.{i}", path.display()));
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "no free file name next to {}",
        path.display()
    )))
}

/// A tiny writer for one JSON object at a time, with nccl-tests' value spellings.
struct Obj<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Obj<'a> {
    fn open(out: &'a mut String) -> Self {
        out.push('{');
        Obj { out, first: true }
    }
    fn key(&mut self, k: &str) -> &mut String {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        let _ = write!(self.out, "{}:", string(k));
        self.out
    }
    fn raw(&mut self, k: &str, v: &str) {
        self.key(k).push_str(v);
    }
    fn close(self) {
        self.out.push('}');
    }
}

fn string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `%lf`, with nccl-tests' `"nan"` (and, to stay valid JSON, `"inf"`/`"-inf"`).
fn double(v: f64) -> String {
    if v.is_nan() {
        "\"nan\"".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "\"inf\"".into()
        } else {
            "\"-inf\"".into()
        }
    } else {
        format!("{v:.6}")
    }
}

fn boolean(b: bool) -> &'static str {
    if b {
        "\"true\""
    } else {
        "\"false\""
    }
}

fn list<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    let v: Vec<String> = items.iter().map(f).collect();
    format!("[{}]", v.join(","))
}

fn cell(c: &CellRecord, cputime: bool) -> String {
    let mut s = String::new();
    let mut o = Obj::open(&mut s);
    o.raw(
        if cputime { "cpu_time" } else { "time" },
        &double(c.time_us),
    );
    o.raw("alg_bw", &double(c.algbw));
    o.raw("bus_bw", &double(c.busbw));
    o.raw(
        "nwrong",
        &c.wrong.map_or("null".into(), |w| double(w as f64)),
    );
    o.close();
    s
}

/// nccl-tests' `*_per_iter` object: the summary over the iterations after the first `skip`
/// (`-K`), computed as nccl-tests computes it, and every iteration's time.
fn per_iter(it: &IterStats, skip: u32) -> String {
    let mut s = String::new();
    let mut o = Obj::open(&mut s);
    // A skip that would leave nothing is no skip (nccl-tests keeps K below the iterations).
    let skip = if (skip as usize) < it.times_us.len() {
        skip
    } else {
        0
    };
    let sum = crate::stats::NcclIterSummary::of(&it.times_us[skip as usize..]);
    o.raw("skipped_iterations", &skip.to_string());
    let field = |f: fn(&crate::stats::NcclIterSummary) -> f64| {
        sum.as_ref()
            .map_or_else(|| "null".to_string(), |x| double(f(x)))
    };
    o.raw("min_us", &field(|x| x.min));
    o.raw("max_us", &field(|x| x.max));
    o.raw("avg_us", &field(|x| x.avg));
    o.raw("p50_us", &field(|x| x.p50));
    o.raw("p95_us", &field(|x| x.p95));
    o.raw("p99_us", &field(|x| x.p99));
    o.raw("stdev_us", &field(|x| x.stdev));
    o.raw("cv_pct", &field(|x| x.cv_pct));
    o.raw("times_us", &list(&it.times_us, |t| double(*t)));
    if it.per_rank_times_us.len() > 1 {
        o.raw(
            "per_process_max_times_us",
            &list(&it.per_rank_times_us, |r| list(r, |t| double(*t))),
        );
    }
    o.close();
    s
}

pub fn render(run: &RunRecord) -> String {
    let mut s = String::new();
    let mut top = Obj::open(&mut s);
    top.raw("version", &VERSION.to_string());
    let start = clock::parse_rfc3339(&run.start_time)
        .map(|t| {
            clock::nccl_tests_stamp(std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(t))
        })
        .unwrap_or_else(|| run.start_time.clone());
    top.raw("start_time", &string(&start));
    top.raw("args", &list(&run.args, |a| string(a)));
    top.raw("env", "[]");
    top.raw("nccl_version", "0");

    let p = &run.plan;
    let mut config = String::new();
    {
        let mut c = Obj::open(&mut config);
        c.raw("nthreads", "1");
        c.raw("ngpus", "1");
        c.raw("minimum_bytes", &p.min_bytes.to_string());
        c.raw("maximum_bytes", &p.max_bytes.to_string());
        match p.step {
            Step::Factor(f) => c.raw("step_factor", &f.to_string()),
            Step::Bytes(b) => c.raw("step_bytes", &b.to_string()),
        }
        c.raw("warmup_iters", &p.warmup_iters.to_string());
        c.raw("iterations", &p.iters.to_string());
        c.raw("aggregated_iterations", &p.agg_iters.to_string());
        c.raw("validation", &p.check.to_string());
        c.raw("graph", "0");
        c.raw("blocking_collectives", boolean(p.blocking != 0));
        c.raw("per_iter_timing", boolean(true));
        c.raw("per_iter_skip", &p.per_iter_skip.to_string());
        c.raw("parallel_init", boolean(p.parallel_init));
        c.raw(
            "devices",
            &list(&run.world.devices, |d| {
                let mut s = String::new();
                let mut o = Obj::open(&mut s);
                o.raw("rank", &d.rank.to_string());
                o.raw("group", &d.group.to_string());
                o.raw("pid", &d.pid.to_string());
                o.raw("hostname", &string(&d.hostname));
                o.raw("device", &d.device.to_string());
                o.raw("device_hex", &string(&d.pci));
                o.raw("device_info", &string(&d.name));
                o.close();
                s
            }),
        );
        c.close();
    }
    top.raw("config", &config);

    let results = list(&run.rows, |r| {
        let mut s = String::new();
        let mut o = Obj::open(&mut s);
        o.raw("size", &r.size.to_string());
        o.raw("count", &r.count.to_string());
        o.raw("type", &string(&r.dtype));
        o.raw("redop", &string(&r.redop));
        o.raw("root", &string(&format!("{:6}", r.root)));
        let (cpu, skip) = (p.cputime, p.per_iter_skip);
        o.raw("out_of_place", &cell(&r.out_of_place, cpu));
        if let Some(it) = &r.out_of_place.iterations {
            o.raw("out_of_place_per_iter", &per_iter(it, skip));
        }
        o.raw("in_place", &cell(&r.in_place, cpu));
        if let Some(it) = &r.in_place.iterations {
            o.raw("in_place_per_iter", &per_iter(it, skip));
        }
        o.raw("actual_iterations", &p.iters.to_string());
        o.raw("experiment_name", "\"\"");
        o.close();
        s
    });
    top.raw("results", &results);

    if let Some(sum) = &run.summary {
        top.raw(
            "out_of_bounds",
            &format!(
                "{{\"count\":{},\"okay\":{}}}",
                sum.out_of_bounds,
                boolean(sum.out_of_bounds == 0)
            ),
        );
        let okay = match sum.bandwidth_ok {
            None => "\"unchecked\"",
            Some(b) => boolean(b),
        };
        top.raw(
            "average_bus_bandwidth",
            &format!(
                "{{\"bandwidth\":{},\"okay\":{okay}}}",
                double(sum.avg_busbw)
            ),
        );
        top.raw("errors", &list(sum.error.as_slice(), |e| string(e)));
    }
    if let Some(end) = run.end_time.as_deref().and_then(clock::parse_rfc3339) {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(end);
        top.raw("end_time", &string(&clock::nccl_tests_stamp(t)));
    }
    top.close();
    s.push('\n');
    s
}

/// Reads an nccl-tests `-J` document (ours or nccl-tests' own) as a [`RunRecord`], so that
/// `compare`, `report` and `history` work on nccl-tests baselines too. nccl-tests stamps
/// times in the host's local time zone without saying which; they are taken as UTC.
pub fn import(v: &serde_json::Value) -> Result<RunRecord, String> {
    use crate::record::DeviceInfo;
    use crate::run::{PlanRecord, RowRecord, SummaryRecord, Versions, WorldRecord};
    use serde_json::Value;
    fn get<'a>(v: &'a Value, k: &str) -> Result<&'a Value, String> {
        v.get(k).ok_or_else(|| format!("no \"{k}\""))
    }
    fn uint(v: &Value, k: &str) -> Result<u64, String> {
        get(v, k)?
            .as_u64()
            .ok_or_else(|| format!("\"{k}\" is not a non-negative integer"))
    }
    // nccl-tests writes NaN as "nan".
    fn float(v: &Value) -> f64 {
        v.as_f64().unwrap_or(f64::NAN)
    }
    fn flag(v: &Value, k: &str) -> bool {
        matches!(v.get(k), Some(Value::String(s)) if s == "true")
            || matches!(v.get(k), Some(Value::Bool(true)))
    }
    fn stamp(v: &Value) -> Option<String> {
        let s = v.as_str()?;
        let (d, t) = s.split_once(' ')?;
        Some(format!("{d}T{t}Z"))
    }
    let cfg = get(v, "config")?;
    let args: Vec<String> = get(v, "args")
        .ok()
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    // nccl-tests' argv[0] is the binary (`.../all_reduce_perf`); busbw's is `busbw
    // all_reduce_perf ...`.
    let program = args
        .iter()
        .take(2)
        .filter_map(|a| a.rsplit('/').next())
        .find(|p| p.ends_with("_perf"))
        .unwrap_or("unknown_perf")
        .to_string();
    let step = match (cfg.get("step_factor"), cfg.get("step_bytes")) {
        (Some(f), _) => Step::Factor(f.as_u64().unwrap_or(1)),
        (None, Some(b)) => Step::Bytes(b.as_u64().unwrap_or(0)),
        (None, None) => Step::Factor(1),
    };
    let devices: Vec<DeviceInfo> = cfg
        .get("devices")
        .and_then(|d| d.as_array())
        .map(|ds| {
            ds.iter()
                .map(|d| DeviceInfo {
                    rank: d.get("rank").and_then(|x| x.as_u64()).unwrap_or(0) as usize,
                    group: d.get("group").and_then(|x| x.as_u64()).unwrap_or(0) as usize,
                    pid: d.get("pid").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
                    hostname: d
                        .get("hostname")
                        .and_then(|x| x.as_str())
                        .unwrap_or("")
                        .into(),
                    device: d.get("device").and_then(|x| x.as_i64()).unwrap_or(0) as i32,
                    pci: d
                        .get("device_hex")
                        .and_then(|x| x.as_str())
                        .unwrap_or("")
                        .into(),
                    name: d
                        .get("device_info")
                        .and_then(|x| x.as_str())
                        .unwrap_or("")
                        .into(),
                })
                .collect()
        })
        .unwrap_or_default();
    let cell = |m: &Value, per_iter: Option<&Value>| -> Result<CellRecord, String> {
        let time = float(
            m.get("time")
                .or_else(|| m.get("cpu_time"))
                .ok_or("no \"time\"")?,
        );
        let iterations = per_iter.and_then(|p| {
            let times: Vec<f64> = p.get("times_us")?.as_array()?.iter().map(float).collect();
            let rows: Vec<Vec<f64>> = p
                .get("per_process_max_times_us")
                .and_then(|r| r.as_array())
                .map(|r| {
                    r.iter()
                        .filter_map(|row| row.as_array().map(|x| x.iter().map(float).collect()))
                        .collect()
                })
                .unwrap_or_default();
            IterStats::from_samples(&times, rows)
        });
        let means: Vec<f64> = iterations
            .as_ref()
            .map(|i| {
                i.per_rank_times_us
                    .iter()
                    .map(|r| r.iter().sum::<f64>() / r.len().max(1) as f64)
                    .collect()
            })
            .unwrap_or_default();
        Ok(CellRecord {
            time_us: time,
            time_min_us: means.iter().copied().reduce(f64::min).unwrap_or(time),
            time_max_us: means.iter().copied().reduce(f64::max).unwrap_or(time),
            algbw: float(get(m, "alg_bw")?),
            busbw: float(get(m, "bus_bw")?),
            wrong: m.get("nwrong").and_then(|w| w.as_f64()).map(|w| w as u64),
            iterations,
        })
    };
    let mut rows = Vec::new();
    for (i, r) in get(v, "results")?
        .as_array()
        .ok_or("\"results\" is not a list")?
        .iter()
        .enumerate()
    {
        let row = (|| -> Result<RowRecord, String> {
            let (Some(oop), Some(ip)) = (r.get("out_of_place"), r.get("in_place")) else {
                return Err("needs out_of_place and in_place".into());
            };
            Ok(RowRecord {
                size: uint(r, "size")?,
                count: uint(r, "count")?,
                dtype: get(r, "type")?.as_str().unwrap_or("").into(),
                redop: get(r, "redop")?.as_str().unwrap_or("").into(),
                root: match get(r, "root")? {
                    Value::String(s) => s.trim().parse().map_err(|_| format!("root {s:?}"))?,
                    n => n.as_i64().ok_or("root is not a number")?,
                },
                algo: None,
                out_of_place: cell(oop, r.get("out_of_place_per_iter"))?,
                in_place: cell(ip, r.get("in_place_per_iter"))?,
            })
        })()
        .map_err(|e| format!("results[{i}]: {e}"))?;
        rows.push(row);
    }
    let summary = v.get("average_bus_bandwidth").map(|avg| SummaryRecord {
        out_of_bounds: v
            .get("out_of_bounds")
            .and_then(|o| o.get("count"))
            .and_then(|c| c.as_u64())
            .unwrap_or(0),
        avg_busbw: avg.get("bandwidth").map_or(f64::NAN, float),
        min_busbw: None,
        bandwidth_ok: match avg.get("okay").and_then(|o| o.as_str()) {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        },
        error: v
            .get("errors")
            .and_then(|e| e.as_array())
            .and_then(|e| e.first())
            .and_then(|e| e.as_str())
            .map(String::from),
    });
    Ok(RunRecord {
        complete: true,
        schema: crate::run::SCHEMA.into(),
        schema_version: crate::run::SCHEMA_VERSION,
        versions: Versions {
            busbw: String::new(),
            nccl_tests: format!(
                "json v{}",
                v.get("version").and_then(|x| x.as_i64()).unwrap_or(0)
            ),
        },
        program,
        args,
        start_time: v.get("start_time").and_then(stamp).unwrap_or_default(),
        end_time: v.get("end_time").and_then(stamp),
        plan: PlanRecord {
            min_bytes: uint(cfg, "minimum_bytes")?,
            max_bytes: uint(cfg, "maximum_bytes")?,
            step,
            warmup_iters: cfg
                .get("warmup_iters")
                .and_then(|x| x.as_u64())
                .unwrap_or(0) as u32,
            iters: uint(cfg, "iterations")? as u32,
            agg_iters: cfg
                .get("aggregated_iterations")
                .and_then(|x| x.as_u64())
                .unwrap_or(1) as u32,
            check: cfg.get("validation").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
            dtypes: Vec::new(),
            ops: Vec::new(),
            root: 0,
            algo: None,
            average: "mean".into(),
            cycles: 1,
            timeout_s: 0,
            min_busbw: None,
            link_rate_gbps: None,
            per_iter_skip: 0,
            cputime: false,
            // nccl-tests writes booleans as strings; the mode itself is not recorded.
            blocking: u8::from(flag(cfg, "blocking_collectives")),
            unalign: 0,
            rotate: None,
            parallel_init: flag(cfg, "parallel_init"),
        },
        world: WorldRecord {
            ranks: devices.len(),
            hosts: RunRecord::hosts_of(&devices),
            labels: Default::default(),
            transports: Vec::new(),
            devices,
        },
        rows,
        summary,
        tiers: None,
        pairwise: None,
        verdict: None,
        tier_report: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn golden() {
        sample::golden("nccl-tests.json", &render(&sample::run()));
    }

    #[test]
    fn cputime_key_and_skipped_iterations() {
        let mut run = sample::run();
        run.plan.cputime = true;
        run.plan.per_iter_skip = 2;
        let v: serde_json::Value = serde_json::from_str(&render(&run)).unwrap();
        assert_eq!(v["config"]["per_iter_skip"], 2);
        let r = &v["results"][0];
        assert!(r["out_of_place"]["cpu_time"].is_f64(), "{r}");
        assert!(r["out_of_place"].get("time").is_none(), "{r}");
        let it = &r["out_of_place_per_iter"];
        assert_eq!(it["skipped_iterations"], 2);
        // The sample's times are [20, 20, 21, 21]: the summary covers the last two.
        assert_eq!(
            it["times_us"].as_array().unwrap().len(),
            4,
            "raw times keep all"
        );
        assert_eq!(
            (it["min_us"].as_f64(), it["cv_pct"].as_f64()),
            (Some(21.0), Some(0.0))
        );
    }

    #[test]
    fn layout_types_and_quirks() {
        let v: serde_json::Value = serde_json::from_str(&render(&sample::run())).unwrap();
        assert_eq!(v["version"], 3);
        assert_eq!(v["env"], serde_json::json!([]));
        assert_eq!(v["config"]["step_factor"], 1024);
        assert_eq!(v["config"]["per_iter_timing"], "true");
        assert_eq!(v["config"]["devices"][1]["device_hex"], "0000:00:00");
        let r = &v["results"][0];
        assert_eq!(r["root"], "    -1");
        assert!(r["out_of_place"]["time"].is_f64());
        assert!(r["out_of_place"]["nwrong"].is_f64());
        // times_us is the per-iteration max over the per-process rows, as the tool checks.
        let it = &r["out_of_place_per_iter"];
        let rows = it["per_process_max_times_us"].as_array().unwrap();
        for (i, t) in it["times_us"].as_array().unwrap().iter().enumerate() {
            let m = rows
                .iter()
                .map(|row| row[i].as_f64().unwrap())
                .fold(0.0, f64::max);
            assert_eq!(t.as_f64().unwrap(), m);
        }
        assert_eq!(v["out_of_bounds"]["okay"], "true");
        assert_eq!(v["average_bus_bandwidth"]["okay"], "unchecked");
        assert_eq!(v["end_time"], "2026-12-01 08:00:05");
        assert_eq!(double(f64::NAN), "\"nan\"");
    }

    #[test]
    fn imports_what_it_writes() {
        let run = sample::run();
        let v: serde_json::Value = serde_json::from_str(&render(&run)).unwrap();
        let back = import(&v).unwrap();
        assert_eq!(back.rows.len(), 2);
        assert_eq!(back.start_time, run.start_time);
        assert_eq!(back.world.devices, run.world.devices);
        for (a, b) in back.rows.iter().zip(&run.rows) {
            assert_eq!((a.size, a.root, &a.dtype), (b.size, b.root, &b.dtype));
            assert_eq!(a.out_of_place.busbw, b.out_of_place.busbw);
            assert_eq!(a.in_place.wrong, b.in_place.wrong);
            let (x, y) = (
                a.out_of_place.iterations.as_ref().unwrap(),
                b.out_of_place.iterations.as_ref().unwrap(),
            );
            assert_eq!(x.times_us, y.times_us);
            assert_eq!(x.per_rank_times_us, y.per_rank_times_us);
        }
        assert_eq!(back.summary.unwrap().avg_busbw, 1.5);
        // Loaded through the common entry point, a -J file just works.
        let r = RunRecord::from_slice(render(&run).as_bytes(), "n.json").unwrap();
        assert_eq!(r.program, "all_reduce_perf");
        let mut v = v;
        v["results"][1]["out_of_place"] = serde_json::json!({"alg_bw": 1.0});
        let e = RunRecord::from_slice(v.to_string().as_bytes(), "n.json").unwrap_err();
        assert!(e.to_string().contains("results[1]: no \"time\""), "{e}");
    }

    #[test]
    fn extension_and_no_clobber() {
        assert!(accepts(Path::new("a/RUN.JSON")));
        assert!(!accepts(Path::new("run.txt")));
        assert!(!accepts(Path::new("json")));
        let dir = std::env::temp_dir().join(format!("busbw-reserve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.json");
        assert_eq!(reserve(&p).unwrap(), p);
        assert_eq!(reserve(&p).unwrap(), dir.join("r.json.0"));
        assert_eq!(reserve(&p).unwrap(), dir.join("r.json.1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
