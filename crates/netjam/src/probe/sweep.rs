//! The sweep: ping over the packet sizes and rates an audio stream would use, then ask
//! the engine for a packetization; and the plot of the result. It never prints: the caller
//! sees each point through a callback.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use netjam_engine::probe::packet::{self, ProbeKey};
use netjam_engine::probe::recommend::PointResult;
use netjam_engine::probe::{recommend, sweep_grid, AudioFormat, Recommendation, SweepPoint};
use serde::Serialize;

use super::ping::{ping, PingConfig};

/// A finished sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub target: SocketAddr,
    pub format: AudioFormat,
    pub seconds_per_point: f64,
    pub points: Vec<PointResult>,
    pub recommendation: Recommendation,
}

/// Ping every point of the grid for `format` and recommend a packetization.
pub fn sweep(
    target: SocketAddr,
    format: AudioFormat,
    seconds_per_point: f64,
    secret: Option<String>,
    loss_limit_pct: f64,
    mut progress: impl FnMut(&SweepPoint, &PointResult),
) -> anyhow::Result<SweepReport> {
    let mut points = Vec::new();
    let min_size = packet::probe_min_len(secret.as_deref().map(|s| ProbeKey::new(s.as_bytes())).as_ref());
    for mut p in sweep_grid(&format) {
        // The smallest audio packets can be shorter than a probe; measure those at the
        // probe minimum and say so in the point's size.
        p.size_bytes = p.size_bytes.max(min_size);
        let cfg = PingConfig {
            target,
            rate_pps: p.packet_rate,
            size: p.size_bytes,
            duration: Duration::from_secs_f64(seconds_per_point.max(0.05)),
            secret: secret.clone(),
            wait_after: Some(Duration::from_millis(500)),
        };
        let out = ping(&cfg).with_context(|| format!("pinging at {:.0} packets/s", p.packet_rate))?;
        let r = PointResult::from_summary(p, &out.report.summary);
        progress(&p, &r);
        points.push(r);
    }
    let recommendation = recommend(&format, &points, loss_limit_pct);
    Ok(SweepReport {
        target,
        format,
        seconds_per_point,
        points,
        recommendation,
    })
}

/// An SVG plot of expected latency (left axis) and loss (right axis) against packet rate.
pub fn sweep_svg(report: &SweepReport) -> String {
    let (w, h, l, r, t, b) = (720.0, 420.0, 70.0, 70.0, 40.0, 60.0);
    let pts = &report.points;
    let fmt = &report.format;
    let lat: Vec<(f64, f64)> = pts
        .iter()
        .filter_map(|p| {
            let f = p.point.frames?;
            let up = p.send_min_ms + p.send_pdv_p99_ms;
            let down = p.receive_min_ms + p.receive_pdv_p99_ms;
            Some((p.point.packet_rate, fmt.packet_time_ms(f) + up.max(down)))
        })
        .collect();
    let loss: Vec<(f64, f64)> = pts
        .iter()
        .map(|p| (p.point.packet_rate, p.send_loss_pct.max(p.receive_loss_pct)))
        .collect();
    let xmin = pts
        .iter()
        .map(|p| p.point.packet_rate)
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let xmax = pts
        .iter()
        .map(|p| p.point.packet_rate)
        .fold(1.0, f64::max)
        .max(xmin * 1.01);
    let ymax = lat.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    let lmax = loss
        .iter()
        .map(|p| p.1)
        .fold(report.recommendation.loss_limit_pct, f64::max)
        .max(1.0)
        * 1.15;
    let x = |v: f64| l + (v.ln() - xmin.ln()) / (xmax.ln() - xmin.ln()) * (w - l - r);
    let y = |v: f64| h - b - v / ymax * (h - t - b);
    let yl = |v: f64| h - b - v / lmax * (h - t - b);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s.push_str(&format!(
        "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">netjam sweep {}: expected mouth-to-ear \
         latency and loss</text>\n",
        w / 2.0,
        report.target
    ));
    s.push_str(&format!(
        "<line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" \
         y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{}\" y1=\"{t}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - b,
        w - r,
        h - b,
        h - b,
        w - r,
        w - r,
        h - b
    ));
    for p in pts {
        let px = x(p.point.packet_rate);
        s.push_str(&format!(
            "<line x1=\"{px:.1}\" y1=\"{}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"black\"/><text x=\"{px:.1}\" \
             y=\"{}\" text-anchor=\"middle\">{:.0}</text>\n",
            h - b,
            h - b + 5.0,
            h - b + 18.0,
            p.point.packet_rate
        ));
    }
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let vl = lmax * i as f64 / 4.0;
        s.push_str(&format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#1f5fbf\">{v:.1}</text><text x=\"{}\" \
             y=\"{:.1}\" fill=\"#c0392b\">{vl:.2}</text>\n",
            l - 6.0,
            y(v) + 4.0,
            w - r + 6.0,
            yl(vl) + 4.0
        ));
    }
    s.push_str(&format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">packets per second (log scale)</text>\n<text x=\"16\" \
         y=\"{}\" fill=\"#1f5fbf\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">expected latency \
         (ms)</text>\n<text x=\"{}\" y=\"{}\" fill=\"#c0392b\" transform=\"rotate(90 {} {})\" \
         text-anchor=\"middle\">loss (%)</text>\n",
        (l + w - r) / 2.0,
        h - 20.0,
        h / 2.0,
        h / 2.0,
        w - 16.0,
        h / 2.0,
        w - 16.0,
        h / 2.0
    ));
    let poly = |pts: &[(f64, f64)], f: &dyn Fn(f64) -> f64| {
        pts.iter()
            .map(|(a, v)| format!("{:.1},{:.1}", x(*a), f(*v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    s.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#1f5fbf\" stroke-width=\"2\"/>\n",
        poly(&lat, &y)
    ));
    s.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\n",
        poly(&loss, &yl)
    ));
    for (a, v) in &lat {
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#1f5fbf\"/>\n",
            x(*a),
            y(*v)
        ));
    }
    if let Some(best) = &report.recommendation.best {
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"7\" fill=\"none\" stroke=\"green\" stroke-width=\"2\"/>\n<text \
             x=\"{:.1}\" y=\"{:.1}\" fill=\"green\">{} frames</text>\n",
            x(best.packet_rate),
            y(best.expected_ms),
            x(best.packet_rate) + 9.0,
            y(best.expected_ms) - 9.0,
            best.frames
        ));
    }
    s.push_str(&format!(
        "<line x1=\"{l}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#c0392b\" stroke-opacity=\"0.4\"/>\n",
        yl(report.recommendation.loss_limit_pct),
        w - r,
        yl(report.recommendation.loss_limit_pct)
    ));
    s.push_str(&format!(
        "<line x1=\"{}\" y1=\"52\" x2=\"{}\" y2=\"52\" stroke=\"#1f5fbf\" stroke-width=\"2\"/><text x=\"{}\" \
         y=\"56\">expected latency, ms (left)</text>\n<line x1=\"{}\" y1=\"68\" x2=\"{}\" y2=\"68\" \
         stroke=\"#c0392b\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/><text x=\"{}\" y=\"72\">loss of the worse \
         direction, % (right); faint line: limit</text>\n",
        l + 10.0,
        l + 40.0,
        l + 46.0,
        l + 10.0,
        l + 40.0,
        l + 46.0
    ));
    s.push_str("</svg>\n");
    s
}
