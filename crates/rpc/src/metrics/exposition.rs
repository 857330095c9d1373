//! Prometheus's text exposition format, version 0.0.4: `# HELP` and
//! `# TYPE` once per family, then one `name{label="value",…} number` line
//! per sample.

use std::fmt::Write as _;

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// `_bucket`, `_sum` and `_count` samples.
    Histogram,
}

/// A scrape's text being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
    /// Families declared so far (a family is declared once per scrape).
    declared: Vec<String>,
    /// The family samples go to (the last declared).
    current: usize,
    /// With [`Exposition::capturing`]: every family and sample, for
    /// exporters that are not Prometheus (OTLP).
    captured: Option<Vec<Family>>,
}

/// A family and its samples, as [`Exposition::capturing`] keeps them.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// Its base name (`grpc_server_call_duration_seconds`).
    pub name: String,
    /// Its type.
    pub kind: Kind,
    /// Its help text.
    pub help: String,
    /// Its samples.
    pub samples: Vec<Sample>,
}

/// A sample: its name (a histogram's `_bucket`, `_sum`, `_count`), its
/// labels, its value.
pub type Sample = (String, Vec<(String, String)>, f64);

impl Exposition {
    /// Declares a family (`name` is its base name: a histogram's samples
    /// add `_bucket`, `_sum`, `_count`). Declaring one twice is a no-op.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        if let Some(i) = self.declared.iter().position(|d| d == name) {
            self.current = i;
            return;
        }
        self.current = self.declared.len();
        self.declared.push(name.to_string());
        if let Some(c) = &mut self.captured {
            c.push(Family {
                name: name.to_string(),
                kind,
                help: help.to_string(),
                samples: Vec::new(),
            });
        }
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample. Label values are escaped; names are the caller's
    /// constants (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        if let Some(f) = self.captured.as_mut().and_then(|c| c.get_mut(self.current)) {
            let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            f.samples.push((name.to_string(), labels, value));
        }
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape_value(&mut self.out, v);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        self.out.push_str(&float(value));
        self.out.push('\n');
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }

    /// An exposition that also keeps what is written ([`Exposition::captured`]).
    pub fn capturing() -> Exposition {
        Exposition { captured: Some(Vec::new()), ..Exposition::default() }
    }

    /// The families and samples written, with [`Exposition::capturing`].
    pub fn captured(self) -> Vec<Family> {
        self.captured.unwrap_or_default()
    }
}

/// A number as Prometheus writes it (`+Inf`, `NaN`, shortest decimal).
pub fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        // Rust's `Display` for f64 is the shortest form that reads back
        // as the same number, without an exponent.
        format!("{v}")
    }
}

fn escape_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(h: &str) -> String {
    h.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_families_declared_once() {
        let mut e = Exposition::default();
        e.family("x_total", Kind::Counter, "Things.\nMore");
        e.family("x_total", Kind::Counter, "again");
        e.sample("x_total", &[("a", "q\"uo\\te\nd")], 3.0);
        e.sample("y", &[], 0.25);
        assert_eq!(
            e.finish(),
            "# HELP x_total Things.\\nMore\n# TYPE x_total counter\n\
             x_total{a=\"q\\\"uo\\\\te\\nd\"} 3\ny 0.25\n"
        );
        assert_eq!(float(1e-5), "0.00001");
        assert_eq!(float(f64::INFINITY), "+Inf");
    }
}
