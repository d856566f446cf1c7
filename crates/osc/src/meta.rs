//! Per-port metadata (documentation, short name, range, default, unit, scale,
//! enumerated options) and its JSON form.
//!
//! Metadata is built and rendered to JSON when the tree is built, never during dispatch,
//! so answering a metadata query on the audio thread only copies prepared bytes. This
//! module must never be called from a realtime path except through those prepared bytes.

use std::fmt::Write as _;

/// How a numeric parameter maps to a control (a fader, a knob).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// Evenly spaced values.
    #[default]
    Linear,
    /// Logarithmic (e.g. frequency, gain in linear units).
    Log,
}

/// A default value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number.
    Number(f64),
    /// A string.
    Text(String),
    /// A boolean.
    Bool(bool),
}

/// What a port means, for humans and for user interfaces.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Meta {
    /// One or two sentences of documentation.
    pub doc: Option<String>,
    /// A short label for a narrow control.
    pub short_name: Option<String>,
    /// Smallest meaningful value.
    pub min: Option<f64>,
    /// Largest meaningful value.
    pub max: Option<f64>,
    /// Value at start.
    pub default: Option<Value>,
    /// Unit, e.g. `"Hz"`, `"dB"`, `"ms"`.
    pub unit: Option<String>,
    /// Control scale.
    pub scale: Option<Scale>,
    /// Names of enumerated options; the value is the index.
    pub options: Vec<String>,
}

impl Meta {
    /// Empty metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the documentation.
    pub fn doc(mut self, doc: &str) -> Self {
        self.doc = Some(doc.to_owned());
        self
    }

    /// Sets the short name.
    pub fn short(mut self, name: &str) -> Self {
        self.short_name = Some(name.to_owned());
        self
    }

    /// Sets min and max.
    pub fn range(mut self, min: f64, max: f64) -> Self {
        self.min = Some(min);
        self.max = Some(max);
        self
    }

    /// Sets a numeric default.
    pub fn default_number(mut self, v: f64) -> Self {
        self.default = Some(Value::Number(v));
        self
    }

    /// Sets a text default.
    pub fn default_text(mut self, v: &str) -> Self {
        self.default = Some(Value::Text(v.to_owned()));
        self
    }

    /// Sets a boolean default.
    pub fn default_bool(mut self, v: bool) -> Self {
        self.default = Some(Value::Bool(v));
        self
    }

    /// Sets the unit.
    pub fn unit(mut self, unit: &str) -> Self {
        self.unit = Some(unit.to_owned());
        self
    }

    /// Sets the scale.
    pub fn scale(mut self, scale: Scale) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Sets enumerated options.
    pub fn options(mut self, options: &[&str]) -> Self {
        self.options = options.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Appends this port's JSON object (with its path and argument spec) to `out`.
    pub(crate) fn write_json(&self, path: &str, args: Option<&str>, out: &mut String) {
        out.push_str("{\"path\":");
        json_str(path, out);
        out.push_str(",\"args\":");
        match args {
            None => out.push_str("null"),
            Some(spec) => {
                out.push('[');
                for (i, alt) in spec.split(':').enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    json_str(alt, out);
                }
                out.push(']');
            }
        }
        if let Some(d) = &self.doc {
            out.push_str(",\"doc\":");
            json_str(d, out);
        }
        if let Some(s) = &self.short_name {
            out.push_str(",\"short_name\":");
            json_str(s, out);
        }
        if let Some(v) = self.min {
            out.push_str(",\"min\":");
            json_num(v, out);
        }
        if let Some(v) = self.max {
            out.push_str(",\"max\":");
            json_num(v, out);
        }
        if let Some(v) = &self.default {
            out.push_str(",\"default\":");
            match v {
                Value::Number(n) => json_num(*n, out),
                Value::Text(t) => json_str(t, out),
                Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            }
        }
        if let Some(u) = &self.unit {
            out.push_str(",\"unit\":");
            json_str(u, out);
        }
        if let Some(s) = self.scale {
            out.push_str(",\"scale\":");
            out.push_str(match s {
                Scale::Linear => "\"linear\"",
                Scale::Log => "\"log\"",
            });
        }
        if !self.options.is_empty() {
            out.push_str(",\"options\":[");
            for (i, o) in self.options.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_str(o, out);
            }
            out.push(']');
        }
        out.push('}');
    }
}

fn json_num(v: f64, out: &mut String) {
    if v.is_finite() {
        let _ = write!(out, "{v}");
    } else {
        out.push_str("null");
    }
}

/// Writes `s` as a JSON string literal.
pub(crate) fn json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape() {
        let m = Meta::new()
            .doc("Cutoff \"frequency\"")
            .short("cut")
            .range(20.0, 20000.0)
            .default_number(1000.0)
            .unit("Hz")
            .scale(Scale::Log)
            .options(&["a", "b"]);
        let mut s = String::new();
        m.write_json("/filter/cutoff", Some(":f"), &mut s);
        assert_eq!(
            s,
            "{\"path\":\"/filter/cutoff\",\"args\":[\"\",\"f\"],\"doc\":\"Cutoff \\\"frequency\\\"\",\
             \"short_name\":\"cut\",\"min\":20,\"max\":20000,\"default\":1000,\"unit\":\"Hz\",\
             \"scale\":\"log\",\"options\":[\"a\",\"b\"]}"
        );
    }
}
