//! Plots of a run with plotters: busbw against size (log scale) per collective, type, op and
//! algorithm, one line per placement and per tier, with link-rate reference lines; a heatmap of
//! the pairwise matrix with slow links marked; the trend of many runs for `history`.
//!
//! Drawing is written once over any plotters backend. SVG (the default) needs no font
//! library: the backend writes `<text>` and the viewer lays it out. PNG rasterises text with a
//! bundled font (see [`crate::font`]) so it, too, works on a machine with no fonts installed.

use crate::export::human_bytes;
use crate::record::PairwiseRecord;
use crate::run::RunRecord;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;

/// Size of every plot, in pixels.
pub const SIZE: (u32, u32) = (900, 540);

/// Why a plot could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("plot {what}: {msg}")]
pub struct PlotError {
    pub what: String,
    pub msg: String,
}

/// What a plot shows, independent of the image format.
#[derive(Debug, Clone, PartialEq)]
pub enum Figure {
    /// Lines of (size, busbw) points.
    Bandwidth {
        title: String,
        lines: Vec<Line>,
        /// (label, GB/s) horizontal reference lines.
        references: Vec<(String, f64)>,
    },
    Heatmap(PairwiseRecord),
    /// Lines of (Unix seconds, busbw) points.
    Trend {
        title: String,
        lines: Vec<Line>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A figure with the file stem it is saved under.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub name: String,
    pub figure: Figure,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// Every plot a run has data for.
pub fn plots(run: &RunRecord) -> Vec<Plot> {
    let mut groups: BTreeMap<(String, String, i64, String), Vec<&crate::run::RowRecord>> =
        BTreeMap::new();
    for r in &run.rows {
        let key = (
            r.dtype.clone(),
            r.redop.clone(),
            r.root,
            r.algo.clone().unwrap_or_default(),
        );
        groups.entry(key).or_default().push(r);
    }
    let mut out = Vec::new();
    for ((dtype, redop, root, algo), rows) in groups {
        let mut title = format!("{} {dtype} {redop}", run.collective());
        if root >= 0 {
            title.push_str(&format!(" root {root}"));
        }
        if !algo.is_empty() {
            title.push_str(&format!(" {algo}"));
        }
        title.push_str(&format!(", {} ranks", run.world.ranks));
        let mut lines = Vec::new();
        for (label, pick) in [
            (
                "out-of-place",
                (|r: &crate::run::RowRecord| r.out_of_place.busbw) as fn(&_) -> f64,
            ),
            ("in-place", |r: &crate::run::RowRecord| r.in_place.busbw),
        ] {
            lines.push(Line {
                label: label.into(),
                points: mean_by_size(rows.iter().map(|r| (r.size, pick(r)))),
            });
        }
        let mut references = Vec::new();
        if let Some(l) = run.plan.link_rate_gbps {
            references.push((format!("link rate {l} GB/s"), l));
        }
        for t in run.tiers.iter().flat_map(|t| &t.tiers) {
            lines.push(Line {
                label: format!("tier {}", t.name),
                points: mean_by_size(t.rows.iter().map(|r| (r.size, r.busbw))),
            });
            if let Some(l) = t.link_rate_gbps {
                references.push((format!("{} link {l} GB/s", t.name), l));
            }
        }
        out.push(Plot {
            name: format!(
                "busbw-{}",
                slug(&title.replace(", ", " ").replace(" ranks", "r"))
            ),
            figure: Figure::Bandwidth {
                title,
                lines,
                references,
            },
        });
    }
    if let Some(p) = &run.pairwise {
        out.push(Plot {
            name: "pairwise".into(),
            figure: Figure::Heatmap(p.clone()),
        });
    }
    out
}

/// Repeated sizes (`-N`) averaged, in size order.
fn mean_by_size(points: impl Iterator<Item = (u64, f64)>) -> Vec<(f64, f64)> {
    let mut m: BTreeMap<u64, (f64, u32)> = BTreeMap::new();
    for (s, v) in points {
        let e = m.entry(s).or_insert((0.0, 0));
        e.0 += v;
        e.1 += 1;
    }
    m.into_iter()
        .map(|(s, (v, n))| (s as f64, v / f64::from(n)))
        .collect()
}

fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> PlotError + '_ {
    move |e| PlotError {
        what: what.into(),
        msg: e.to_string(),
    }
}

impl Plot {
    /// The figure as a standalone SVG document.
    pub fn svg(&self) -> Result<String, PlotError> {
        crate::font::register();
        let mut s = String::new();
        {
            let root = SVGBackend::with_string(&mut s, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(err(&self.name))?;
        }
        Ok(s)
    }

    /// The figure as a PNG file.
    pub fn png(&self, path: &std::path::Path) -> Result<(), PlotError> {
        crate::font::register();
        let root = BitMapBackend::new(path, SIZE).into_drawing_area();
        self.draw(&root)?;
        root.present().map_err(err(&self.name))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let e = err(&self.name);
        root.fill(&WHITE).map_err(&e)?;
        match &self.figure {
            Figure::Bandwidth {
                title,
                lines,
                references,
            } => bandwidth(root, title, lines, references).map_err(&e),
            Figure::Heatmap(p) => heatmap(root, p).map_err(&e),
            Figure::Trend { title, lines } => trend(root, title, lines).map_err(&e),
        }
    }
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Each line in its colour with a dot per point and a legend entry.
fn draw_lines<DB: DrawingBackend, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    lines: &[Line],
) -> DrawResult<DB> {
    for (i, l) in lines.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(l.points.iter().copied(), c.stroke_width(2)))?
            .label(&l.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart.draw_series(l.points.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    Ok(())
}

fn bandwidth<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &[Line],
    references: &[(String, f64)],
) -> DrawResult<DB> {
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (mut lo, mut hi) = xs.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    if !lo.is_finite() || lo <= 0.0 {
        lo = 1.0;
    }
    if hi <= lo {
        hi = lo * 4.0;
        lo /= 4.0;
    }
    let ymax = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .chain(references.iter().map(|r| r.1))
        .fold(0.0f64, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(size_ticks(lo, hi)),
            0.0..ymax,
        )?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc("busbw (GB/s)")
        .x_label_formatter(&|v| human_bytes(v.round() as u64))
        .y_label_formatter(&|v| format!("{v:.2}"))
        .draw()?;
    draw_lines(&mut chart, lines)?;
    for (i, (label, v)) in references.iter().enumerate() {
        let c = COLORS[(lines.len() + i) % COLORS.len()];
        let style = c.stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new(vec![(lo, *v), (hi, *v)], 8, 5, style))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Powers of two between `lo` and `hi`, thinned to at most 10 ticks: sizes read as 1 KiB,
/// 4 KiB, not 1000 B.
fn size_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut all = Vec::new();
    let mut v = 1.0f64;
    while v <= hi {
        if v >= lo {
            all.push(v);
        }
        v *= 2.0;
    }
    let stride = all.len().div_ceil(10).max(1);
    all.into_iter().step_by(stride).collect()
}

/// Red (slow) to green (fast), relative to the matrix's own range.
fn heat(v: f64, lo: f64, hi: f64) -> RGBColor {
    let t = if hi > lo {
        ((v - lo) / (hi - lo)).clamp(0.0, 1.0)
    } else {
        1.0
    };
    RGBColor((230.0 - 180.0 * t) as u8, (60.0 + 140.0 * t) as u8, 70)
}

fn heatmap<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    p: &PairwiseRecord,
) -> DrawResult<DB> {
    let n = p.nodes.len().max(1) as i32;
    let values = p.busbw.iter().flatten().flatten().copied();
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let title = format!(
        "pairwise busbw (GB/s) at {}, slow links outlined",
        human_bytes(p.size)
    );
    let names = p.nodes.clone();
    let label = move |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    };
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(100)
        // A segmented `0..k` range has k + 1 segments.
        .build_cartesian_2d((0..n - 1).into_segmented(), (0..n - 1).into_segmented())?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(n as usize)
        .y_labels(n as usize)
        .x_label_formatter(&label)
        .y_label_formatter(&label)
        .draw()?;
    let slow = |i: usize, j: usize| {
        p.slow
            .iter()
            .any(|s| (s.a, s.b) == (i, j) || (s.a, s.b) == (j, i))
    };
    for (i, row) in p.busbw.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            let (x0, y0) = (SegmentValue::Exact(j as i32), SegmentValue::Exact(i as i32));
            let (x1, y1) = (
                SegmentValue::Exact(j as i32 + 1),
                SegmentValue::Exact(i as i32 + 1),
            );
            let fill = v.map_or(RGBColor(225, 225, 225), |v| heat(v, lo, hi));
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0.clone(), y0.clone()), (x1.clone(), y1.clone())],
                fill.filled(),
            )))?;
            if slow(i, j) {
                // A path, not a rectangle outline: SVG rectangles lose their stroke width.
                let ring = vec![
                    (x0.clone(), y0.clone()),
                    (x1.clone(), y0.clone()),
                    (x1.clone(), y1.clone()),
                    (x0.clone(), y1.clone()),
                    (x0, y0),
                ];
                chart.draw_series(std::iter::once(PathElement::new(
                    ring,
                    BLACK.stroke_width(4),
                )))?;
            }
            let text = v.map_or("-".to_string(), |v| format!("{v:.2}"));
            let at = (
                SegmentValue::CenterOf(j as i32),
                SegmentValue::CenterOf(i as i32),
            );
            chart.draw_series(std::iter::once(Text::new(
                text,
                at,
                ("sans-serif", 16).into_font().color(&BLACK),
            )))?;
        }
    }
    Ok(())
}

fn trend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &[Line],
) -> DrawResult<DB> {
    let xs: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .collect();
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if !lo.is_finite() {
        (0.0, 1.0)
    } else if hi > lo {
        (lo, hi)
    } else {
        (lo - 43200.0, hi + 43200.0)
    };
    let pad = (hi - lo) * 0.04;
    let ymax = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((lo - pad)..(hi + pad), 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("run start (UTC)")
        .y_desc("busbw (GB/s)")
        .x_labels(6)
        .x_label_formatter(&|v| {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(v.max(0.0));
            crate::clock::rfc3339(t)[..16].replace('T', " ")
        })
        .draw()?;
    draw_lines(&mut chart, lines)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;

    #[test]
    fn one_bandwidth_plot_per_group_with_tier_lines_and_references() {
        let run = sample::run_with_tiers();
        let p = plots(&run);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].name, "busbw-all-reduce-float-sum-ring-2r");
        let Figure::Bandwidth {
            lines, references, ..
        } = &p[0].figure
        else {
            panic!()
        };
        let labels: Vec<&str> = lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "out-of-place",
                "in-place",
                "tier same-rack",
                "tier cross-rack"
            ]
        );
        assert_eq!(lines[0].points, [(1024.0, 0.0512), (1048576.0, 1.497966)]);
        assert_eq!(references.len(), 3);
        assert!(matches!(p[1].figure, Figure::Heatmap(_)));
    }

    #[test]
    fn svg_has_the_lines_labels_and_marks() {
        let run = sample::run_with_tiers();
        let p = plots(&run);
        let svg = p[0].svg().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.matches("<polyline").count() >= 4 + 3, "{svg}");
        assert!(svg.contains("tier cross-rack") && svg.contains("link rate 2 GB/s"));
        assert!(svg.contains("1 MiB"));
        let heat = p[1].svg().unwrap();
        assert!(heat.contains("node-c") && heat.contains("0.40"));
        // The slow link (0,2) and its mirror are outlined: two thick rectangles.
        assert_eq!(heat.matches("stroke-width=\"4\"").count(), 2, "{heat}");
    }

    #[test]
    fn png_renders_with_the_bundled_font() {
        let dir = std::env::temp_dir().join(format!("busbw-png-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.png");
        plots(&sample::run_with_tiers())[0].png(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 5000, "{} bytes", bytes.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
