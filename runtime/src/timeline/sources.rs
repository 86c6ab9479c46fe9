//! The user's source lines in the log. The runtime's `cut` line names the op a fusion cut was
//! at; only the host knows which line of the user's program recorded that op. So a host tags
//! the ops it records ([`Timeline::set_tag`]: a source id in the tag's high 32 bits) and names
//! each id once ([`Timeline::name_source`]). A cut event (with the tag of the op cut at) then
//! names its source: in a trace file as `args.source`, and, while the log prints cuts (the
//! timeline then records the cut events without a file), in a line after each cut line.
//!
//! Off (the log does not print cuts), nothing of this runs. On, the timeline's hooks run as
//! for a trace with no file (each event is made and dropped), and ops recorded in defer mode
//! keep their tags; the host pays for finding each op's source line (see `logs_cuts`).

use super::{Arg, Event, Timeline, LOGGING};
use std::sync::atomic::Ordering;

/// The log target of the runtime's cut lines (exec.rs): a source line goes to the same target,
/// so the directive that prints cuts prints their sources.
const CUT_TARGET: &str = "deferfuse_runtime::exec";

impl Timeline {
    /// Turns source lines for cuts on when the log prints cuts (`DEFERFUSE_LOG` at debug for
    /// the runtime, or a host's own subscriber). Called once the subscriber is installed.
    pub fn log_cuts_if_enabled(&self) {
        if tracing::enabled!(target: CUT_TARGET, tracing::Level::DEBUG) {
            self.state.fetch_or(LOGGING, Ordering::Relaxed);
        }
    }

    /// Whether the log prints cuts with their source lines: a host then tags each op it
    /// records with its source and names the sources (a cost it pays only then).
    pub fn logs_cuts(&self) -> bool {
        self.state.load(Ordering::Relaxed) & LOGGING != 0
    }

    /// Names source id `id` (the high 32 bits of the tags a host sets): what the log prints for
    /// a cut at an op recorded with it. A later name for the same id replaces the earlier one.
    pub fn name_source(&self, id: u32, text: &str) {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, text.to_string());
    }

    /// Adds to a cut event the source line of the op it was at (the source id its `tag`
    /// carries, as the host named it): a trace file's cut shows it as `args.source`, and the
    /// log, when it prints cuts, prints it after the cut line.
    pub(super) fn name_cut(&self, ev: &mut Event) {
        let id = ev.args.iter().find_map(|(k, v)| match (k, v) {
            (&"tag", Arg::U(t)) if t >> 32 != 0 => Some((t >> 32) as u32),
            _ => None,
        });
        let name = id.and_then(|i| {
            let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
            sources.get(&i).cloned()
        });
        if self.logs_cuts() {
            let at = match (id, &name) {
                (_, Some(n)) => n.as_str(),
                (Some(_), None) => "(an unnamed source)",
                (None, None) => "(no source line)",
            };
            tracing::debug!(target: CUT_TARGET, "{} at {at}", ev.name);
        }
        if let Some(n) = name {
            ev.args.push(("source", Arg::S(n)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Track;
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What the log prints at debug while `f` runs on this thread.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let out = sink.0.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        text
    }

    fn cut(t: &Timeline, tag: Option<u64>) {
        let args = tag.map(|t| vec![("tag", Arg::U(t))]).unwrap_or_default();
        t.instant(Track::StreamHost(0), "cut", "cut (shape)", args);
    }

    #[test]
    fn a_cut_names_the_source_its_tag_carries_when_the_log_prints_cuts() {
        let text = logged(|| {
            let t = Timeline::default();
            t.log_cuts_if_enabled();
            assert!(t.logs_cuts() && t.on() && !t.tracing() && !t.timing());
            t.name_source(3, "model.py:12 in step");
            cut(&t, Some((3 << 32) | 77));
            cut(&t, None);
        });
        assert!(
            text.contains("cut (shape) at model.py:12 in step"),
            "{text}"
        );
        assert!(text.contains("cut (shape) at (no source line)"), "{text}");
    }

    #[test]
    fn a_traced_cut_carries_the_name_of_its_source() {
        let t = Timeline::default();
        let p = std::env::temp_dir().join(format!("dfuse-sources-{}.json", std::process::id()));
        t.start(&p, 8).unwrap();
        t.name_source(2, "model.py:7 in f");
        cut(&t, Some(2 << 32));
        cut(&t, Some(9));
        t.stop().unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(p);
        assert_eq!(
            text.matches("\"source\":\"model.py:7 in f\"").count(),
            1,
            "{text}"
        );
    }

    #[test]
    fn nothing_is_logged_or_recorded_when_the_log_does_not_print_cuts() {
        let t = Timeline::default();
        let text = logged(|| {
            let quiet = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .finish();
            tracing::subscriber::with_default(quiet, || t.log_cuts_if_enabled());
            cut(&t, Some(1 << 32));
        });
        assert!(!t.logs_cuts() && !t.on(), "the hooks stay one load");
        assert!(text.is_empty(), "{text}");
    }
}
