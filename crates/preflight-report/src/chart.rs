//! The bandwidth sweep as an inline SVG line chart: bus bandwidth against
//! message size (log scale), one line per operation, each with its own
//! colour, dash and point shape (readable in grey), and the thresholds
//! drawn as labelled lines. No script, no external font.

use std::fmt::Write;

use preflight_ground::values::format_bytes;
use preflight_result::collective::{Row, ops_in_order};
use preflight_result::merged::ThresholdResult;

const W: f64 = 640.0;
const H: f64 = 300.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;

/// Colour, dash and shape per line: distinct without colour too.
const STYLES: [(&str, &str, Shape); 5] = [
    ("#1f77b4", "", Shape::Circle),
    ("#d62728", "6 3", Shape::Square),
    ("#2ca02c", "2 3", Shape::Triangle),
    ("#9467bd", "8 3 2 3", Shape::Diamond),
    ("#8c564b", "1 2", Shape::Cross),
];

#[derive(Clone, Copy)]
enum Shape {
    Circle,
    Square,
    Triangle,
    Diamond,
    Cross,
}

/// `rows` of one backend; `None` when there is nothing to draw.
pub fn sweep_chart(backend: &str, rows: &[Row], thresholds: &[&ThresholdResult]) -> Option<String> {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.bytes > 0).collect();
    if rows.is_empty() {
        return None;
    }
    let lx = |b: usize| (b as f64).log2();
    let (mut x0, mut x1) = rows.iter().fold((f64::MAX, f64::MIN), |(a, b), r| {
        (a.min(lx(r.bytes)), b.max(lx(r.bytes)))
    });
    for t in thresholds {
        if let Some(b) = t.threshold.bytes.filter(|b| *b > 0) {
            x0 = x0.min(lx(b));
            x1 = x1.max(lx(b));
        }
    }
    if x1 - x0 < 1.0 {
        x0 -= 0.5;
        x1 += 0.5;
    }
    let top = rows
        .iter()
        .map(|r| r.busbw)
        .chain(thresholds.iter().map(|t| t.threshold.min_busbw))
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let y_max = nice_ceiling(top * 1.1);
    let px = |v: f64| LEFT + (v - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    let py = |v: f64| TOP + (1.0 - (v / y_max).clamp(0.0, 1.0)) * (H - TOP - BOTTOM);
    let mut s = String::new();
    let label = format!("{backend}: bus bandwidth (GB/s) by message size");
    let _ = write!(
        s,
        r#"<svg class="chart" role="img" aria-label="{}" viewBox="0 0 {W} {H}" width="{W}" height="{H}"><title>{}</title>"#,
        super::markup::escape(&label),
        super::markup::escape(&label)
    );
    // Axes, grid and ticks.
    let _ = write!(
        s,
        r##"<g class="axes" font-size="11" fill="#333" stroke="none"><line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="#333"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}" stroke="#333"/>"##,
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM,
        H - BOTTOM
    );
    for i in 0..=4 {
        let v = y_max * i as f64 / 4.0;
        let y = py(v);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            tick(v)
        );
    }
    let step = ((x1 - x0) / 6.0).ceil().max(1.0) as i64;
    let mut e = x0.ceil() as i64;
    while e as f64 <= x1 {
        let x = px(e as f64);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#333"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 4.0,
            H - BOTTOM + 16.0,
            format_bytes(1u64 << e.clamp(0, 62))
        );
        e += step;
    }
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle">message size</text><text transform="translate(14 {}) rotate(-90)" text-anchor="middle">busbw (GB/s)</text></g>"##,
        LEFT + (W - LEFT - RIGHT) / 2.0,
        H - 6.0,
        TOP + (H - TOP - BOTTOM) / 2.0
    );
    // One line per operation, in the order measured.
    let ops = ops_in_order(rows.iter().copied());
    for (i, op) in ops.iter().enumerate() {
        let (colour, dash, shape) = STYLES[i % STYLES.len()];
        let points: Vec<(f64, f64, &Row)> = rows
            .iter()
            .filter(|r| r.op == *op)
            .map(|r| (px(lx(r.bytes)), py(r.busbw), *r))
            .collect();
        let path: Vec<String> = points
            .iter()
            .map(|(x, y, _)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = write!(
            s,
            r#"<g class="series" data-op="{}"><polyline fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}" points="{}"/>"#,
            op.name(),
            path.join(" ")
        );
        for (x, y, r) in &points {
            let _ = write!(
                s,
                "<g class=\"point\">{}<title>{} {}: busbw {:.3} GB/s, algbw {:.3} GB/s, {:.1} µs</title></g>",
                marker(shape, *x, *y, colour),
                op.name(),
                format_bytes(r.bytes as u64),
                r.busbw,
                r.algbw,
                r.time_us
            );
        }
        s.push_str("</g>");
        // Legend entry.
        let ly = TOP + 8.0 + i as f64 * 18.0;
        let lx0 = W - RIGHT + 12.0;
        let _ = write!(
            s,
            r##"<line x1="{lx0}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>{}<text x="{}" y="{}" font-size="11" fill="#333">{}</text>"##,
            lx0 + 28.0,
            marker(shape, lx0 + 14.0, ly, colour),
            lx0 + 34.0,
            ly + 4.0,
            op.name()
        );
    }
    for (i, t) in thresholds.iter().enumerate() {
        let y = py(t.threshold.min_busbw);
        let colour = if t.status == preflight_result::Status::Pass {
            "#555"
        } else {
            "#b00"
        };
        let at = t
            .threshold
            .bytes
            .map_or("largest size".into(), |b| format_bytes(b as u64));
        let _ = write!(
            s,
            r##"<g class="threshold"><line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="{colour}" stroke-width="1.5" stroke-dasharray="10 4"/><title>{}: {} at {at} ≥ {:.3} GB/s ({})</title></g>"##,
            W - RIGHT,
            super::markup::escape(&t.check),
            super::markup::escape(&t.threshold.op),
            t.threshold.min_busbw,
            t.status.name()
        );
        if let Some(b) = t.threshold.bytes.filter(|b| *b > 0) {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{y:.1}" r="5" fill="none" stroke="{colour}" stroke-width="2"/>"#,
                px(lx(b))
            );
        }
        // Two lines each, so that the legend fits its column: the
        // minimum, then what it is for.
        let ly = TOP + 8.0 + (ops.len() + 2 * i) as f64 * 18.0;
        let lx0 = W - RIGHT + 12.0;
        let _ = write!(
            s,
            r##"<line x1="{lx0}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="1.5" stroke-dasharray="10 4"/><text x="{}" y="{}" font-size="11" fill="#333">≥ {:.3} GB/s</text><text x="{}" y="{}" font-size="11" fill="#333">{}, {}</text>"##,
            lx0 + 28.0,
            lx0 + 34.0,
            ly + 4.0,
            t.threshold.min_busbw,
            lx0 + 34.0,
            ly + 18.0,
            super::markup::escape(&t.threshold.op),
            t.status.name()
        );
    }
    s.push_str("</svg>");
    Some(s)
}

fn marker(shape: Shape, x: f64, y: f64, colour: &str) -> String {
    match shape {
        Shape::Circle => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{colour}"/>"#),
        Shape::Square => format!(
            r#"<rect x="{:.1}" y="{:.1}" width="7" height="7" fill="{colour}"/>"#,
            x - 3.5,
            y - 3.5
        ),
        Shape::Triangle => format!(
            r#"<polygon points="{x:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{colour}"/>"#,
            y - 4.5,
            x - 4.0,
            y + 3.5,
            x + 4.0,
            y + 3.5
        ),
        Shape::Diamond => format!(
            r#"<polygon points="{x:.1},{:.1} {:.1},{y:.1} {x:.1},{:.1} {:.1},{y:.1}" fill="{colour}"/>"#,
            y - 4.5,
            x + 4.5,
            y + 4.5,
            x - 4.5
        ),
        Shape::Cross => format!(
            r#"<path d="M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}" stroke="{colour}" stroke-width="2"/>"#,
            x - 4.0,
            y - 4.0,
            x + 4.0,
            y + 4.0,
            x - 4.0,
            y + 4.0,
            x + 4.0,
            y - 4.0
        ),
    }
}

/// 1, 2 or 5 times a power of ten at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * p)
}

fn tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_result::collective::Op;

    #[test]
    fn nice_ceilings_are_round_and_not_below() {
        for (v, want) in [
            (0.011, 0.02),
            (2.2, 2.5),
            (7.0, 10.0),
            (0.0, 1.0),
            (100.0, 100.0),
        ] {
            assert!((nice_ceiling(v) - want).abs() < 1e-12, "{v}");
        }
    }

    #[test]
    fn a_sweep_draws_one_line_per_operation() {
        let rows = vec![
            Row::new(
                Op::Allreduce,
                1024,
                preflight_result::collective::Dtype::F32,
                10.0,
                4,
            ),
            Row::new(
                Op::Allreduce,
                4096,
                preflight_result::collective::Dtype::F32,
                20.0,
                4,
            ),
            Row::new(
                Op::Allgather,
                4096,
                preflight_result::collective::Dtype::F32,
                20.0,
                4,
            ),
        ];
        let svg = sweep_chart("tcp", &rows, &[]).expect("a chart");
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(sweep_chart("tcp", &[], &[]).is_none());
        // Every legend text fits inside the chart at 11 px (at most about
        // 6.5 px a character), thresholds' included.
        let threshold = preflight_result::merged::ThresholdResult {
            check: "collective.tcp_busbw".into(),
            status: preflight_result::Status::Warn,
            threshold: preflight_result::collective::Threshold {
                backend: "tcp".into(),
                op: "allreduce".into(),
                bytes: Some(4096),
                min_busbw: 0.05,
            },
        };
        let svg = sweep_chart("tcp", &rows, &[&threshold]).expect("a chart");
        for text in svg.split("<text x=\"").skip(1) {
            let x: f64 = text.split('"').next().unwrap().parse().unwrap();
            let words = text.split('>').nth(1).unwrap().split('<').next().unwrap();
            let end = x + 6.5 * words.chars().count() as f64;
            assert!(end <= W, "`{words}` ends at {end}, past {W}");
        }
        assert!(
            svg.contains(">≥ 0.050 GB/s<") && svg.contains(">allreduce, warn<"),
            "{svg}"
        );
    }
}
