//! The Chrome trace event format (JSON object form), which chrome://tracing, Perfetto
//! (ui.perfetto.dev) and the report page read. Written by hand: a few event shapes, no
//! serialization library needed.

use super::{Arg, Event, Track};
use std::collections::BTreeSet;
use std::fmt::Write;

/// A region of the file's `deferfuse_regions` list.
pub struct RegionJson<'a> {
    pub fingerprint: u128,
    pub label: &'a str,
    pub text: &'a str,
    pub dot: Option<&'a str>,
}

/// The viewer's thread id of a track: tracks of one stream sit together, workers last.
fn tid(t: Track) -> u64 {
    match t {
        Track::Host => 0,
        Track::StreamHost(s) => 1 + 2 * s,
        Track::StreamDevice(s) => 2 + 2 * s,
        Track::Worker(k) => (1 << 40) + k,
    }
}

fn track_name(t: Track) -> String {
    match t {
        Track::Host => "host".into(),
        Track::StreamHost(s) => format!("stream {s} (host)"),
        Track::StreamDevice(s) => format!("stream {s} (programs)"),
        Track::Worker(k) => format!("cpu worker {k}"),
    }
}

/// Appends `s` as a JSON string literal.
pub fn push_str(out: &mut String, s: &str) {
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

fn push_arg(out: &mut String, a: &Arg) {
    match a {
        Arg::U(v) => {
            let _ = write!(out, "{v}");
        }
        // JSON has no NaN or infinity.
        Arg::F(v) if v.is_finite() => {
            let _ = write!(out, "{v}");
        }
        Arg::F(_) => out.push_str("null"),
        Arg::S(s) => push_str(out, s),
        Arg::B(b) => out.push_str(if *b { "true" } else { "false" }),
    }
}

/// Microseconds (the format's unit) with nanosecond precision.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn push_event(out: &mut String, e: &Event) {
    out.push_str("{\"name\":");
    push_str(out, &e.name);
    let _ = write!(
        out,
        ",\"cat\":\"{}\",\"pid\":1,\"tid\":{}",
        e.cat,
        tid(e.track)
    );
    let _ = write!(out, ",\"ts\":{}", us(e.start_ns));
    match e.dur_ns {
        Some(d) => {
            let _ = write!(out, ",\"ph\":\"X\",\"dur\":{}", us(d));
        }
        None => out.push_str(",\"ph\":\"i\",\"s\":\"t\""),
    }
    out.push_str(",\"args\":{");
    for (k, (name, a)) in e.args.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        push_str(out, name);
        out.push(':');
        push_arg(out, a);
    }
    out.push_str("}}");
}

/// The whole file: events (then each track's name and order), the dropped count, and the
/// regions that ran.
pub fn chrome_trace<'a>(
    events: impl Iterator<Item = &'a Event>,
    dropped: u64,
    regions: impl Iterator<Item = RegionJson<'a>>,
) -> String {
    let mut out = String::from("{\"traceEvents\":[\n");
    let mut tracks = BTreeSet::new();
    let mut first = true;
    for e in events {
        if !first {
            out.push_str(",\n");
        }
        first = false;
        tracks.insert(e.track);
        push_event(&mut out, e);
    }
    if !first {
        out.push_str(",\n");
    }
    out.push_str(
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"deferfuse\"}}",
    );
    for t in tracks {
        out.push_str(",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,");
        let _ = write!(out, "\"tid\":{},\"args\":{{\"name\":", tid(t));
        push_str(&mut out, &track_name(t));
        out.push_str("}}");
        let _ = write!(
            out,
            ",\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"sort_index\":{}}}}}",
            tid(t),
            tid(t).min(1 << 41)
        );
    }
    let _ = write!(
        out,
        "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"dropped_events\":{dropped}}},\n\"deferfuse_regions\":["
    );
    for (k, r) in regions.enumerate() {
        if k > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "\n{{\"fingerprint\":\"{:032x}\",\"label\":",
            r.fingerprint
        );
        push_str(&mut out, r.label);
        out.push_str(",\"text\":");
        push_str(&mut out, r.text);
        out.push_str(",\"dot\":");
        match r.dot {
            Some(d) => push_str(&mut out, d),
            None => out.push_str("null"),
        }
        out.push('}');
    }
    out.push_str("\n]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_as_json_requires() {
        let mut s = String::new();
        push_str(&mut s, "a\"b\\c\nd\u{1}");
        assert_eq!(s, r#""a\"b\\c\nd\u0001""#);
    }

    #[test]
    fn a_span_has_a_duration_and_an_instant_has_none() {
        let e = |dur| Event {
            name: "x".into(),
            cat: "run",
            track: Track::StreamDevice(0),
            start_ns: 1500,
            dur_ns: dur,
            args: vec![("n", Arg::U(3))],
        };
        let mut s = String::new();
        push_event(&mut s, &e(Some(2001)));
        assert!(s.contains(r#""ts":1.500,"ph":"X","dur":2.001"#), "{s}");
        let mut s = String::new();
        push_event(&mut s, &e(None));
        assert!(s.contains(r#""ph":"i""#) && !s.contains("dur"), "{s}");
        assert!(s.contains(r#""args":{"n":3}"#), "{s}");
    }
}
