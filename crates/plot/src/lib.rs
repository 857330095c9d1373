//! A small SVG line chart: a grid of panels sharing categorical x values,
//! each with a few named series. Enough for the plots protoplane's commands
//! write beside their CSV (`bench split`'s knee, `bench inc`, `bench
//! offload`, `sim`) without a plotting dependency.

use std::fmt::Write as _;

/// One line of a panel: a name for the legend, a colour, a y per x
/// (`NaN`: no point).
#[derive(Clone, Debug)]
pub struct Series {
    /// The legend's name.
    pub name: String,
    /// An SVG colour.
    pub color: &'static str,
    /// One y per x of the grid.
    pub ys: Vec<f64>,
}

/// One chart.
#[derive(Clone, Debug)]
pub struct Panel {
    /// Above the chart.
    pub title: String,
    /// Beside the y axis.
    pub y_label: String,
    /// Its lines.
    pub series: Vec<Series>,
}

const W: f64 = 320.0;
const H: f64 = 220.0;
const LEFT: f64 = 62.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 42.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A round number near `x` for axis ticks.
fn nice(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    let m = x / p;
    let n = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    n * p
}

fn tick(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

/// The panels in a grid of `cols` columns, x positions labelled `xs` and
/// titled `x_label`, with a title line on top.
pub fn grid(title: &str, x_label: &str, xs: &[String], panels: &[Panel], cols: usize) -> String {
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols);
    let (width, height) = (W * cols as f64, H * rows as f64 + 30.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="10">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="18" font-size="13" text-anchor="middle">{}</text>"#,
        width / 2.0,
        esc(title)
    );
    for (i, p) in panels.iter().enumerate() {
        let (ox, oy) = ((i % cols) as f64 * W, (i / cols) as f64 * H + 30.0);
        panel(&mut s, p, xs, x_label, ox, oy);
    }
    s.push_str("</svg>\n");
    s
}

fn panel(s: &mut String, p: &Panel, xs: &[String], x_label: &str, ox: f64, oy: f64) {
    let (x0, x1) = (ox + LEFT, ox + W - RIGHT);
    let (y0, y1) = (oy + H - BOTTOM, oy + TOP);
    let max = p.series.iter().flat_map(|s| s.ys.iter()).copied().filter(|v| v.is_finite());
    let top = nice(max.fold(0.0, f64::max) * 1.05);
    let step = nice(top / 5.0);
    let n = xs.len().max(2) - 1;
    let px = |i: usize| x0 + (x1 - x0) * i as f64 / n as f64;
    let py = |v: f64| y0 - (y0 - y1) * (v / top).clamp(0.0, 1.0);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        oy + 14.0,
        esc(&p.title)
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"#,
        ox + 12.0,
        (y0 + y1) / 2.0,
        ox + 12.0,
        (y0 + y1) / 2.0,
        esc(&p.y_label)
    );
    let mut v = 0.0;
    while v <= top + step / 2.0 {
        let y = py(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            x0 - 4.0,
            y + 3.0,
            tick(v)
        );
        v += step;
    }
    for (i, x) in xs.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            px(i),
            y0 + 13.0,
            esc(x)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        y0 + 28.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r##"<polyline points="{x0},{y1} {x0},{y0} {x1},{y0}" fill="none" stroke="#444"/>"##
    );
    for (k, line) in p.series.iter().enumerate() {
        let pts: Vec<String> = line
            .ys
            .iter()
            .enumerate()
            .filter(|(_, y)| y.is_finite())
            .map(|(i, y)| format!("{:.1},{:.1}", px(i), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.8"/>"#,
            pts.join(" "),
            line.color
        );
        for pt in &pts {
            let (x, y) = pt.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="2.2" fill="{}"/>"#, line.color);
        }
        let ly = y1 + 4.0 + 12.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            x1 - 92.0,
            x1 - 78.0,
            line.color,
            x1 - 74.0,
            ly + 3.0,
            esc(&line.name)
        );
    }
}
