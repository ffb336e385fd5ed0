//! Tracing setup: one subscriber per process, text for people and JSON for log pipelines.

use std::fmt;
use std::io::IsTerminal;
use std::str::FromStr;

use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::writer::{build_non_blocking, LogGuard, LOG_QUEUE_LINES};
use crate::Error;

/// The filter used when neither `--log-level` nor `RUST_LOG` says anything.
pub const DEFAULT_LOG_FILTER: &str = "info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line, event fields flattened to the top level.
    Json,
}

impl LogFormat {
    pub const fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LogFormat {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(Error::UnknownLogFormat(s.to_owned())),
        }
    }
}

/// Validated logging settings, built once in `main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub format: LogFormat,
    /// `EnvFilter` directives, e.g. `info` or `warn,berth_controller=debug`.
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::default(),
            filter: DEFAULT_LOG_FILTER.to_owned(),
        }
    }
}

/// Picks the filter directives: an explicit `--log-level` wins over `RUST_LOG`, so a flag in a
/// manifest is never silently overridden by an environment inherited from elsewhere.
/// Blank values count as unset.
pub fn resolve_log_filter(log_level: Option<&str>, rust_log: Option<&str>) -> String {
    [log_level, rust_log]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|s| !s.is_empty())
        .unwrap_or(DEFAULT_LOG_FILTER)
        .to_owned()
}

/// Parses filter directives, rejecting malformed ones instead of ignoring them as `EnvFilter`'s
/// lenient constructors do.
pub fn build_filter(directives: &str) -> Result<EnvFilter, Error> {
    EnvFilter::builder()
        .parse(directives)
        .map_err(|source| Error::InvalidLogFilter {
            filter: directives.to_owned(),
            source,
        })
}

/// Builds (without installing) a subscriber writing to `writer`; tests install it locally with
/// `tracing::subscriber::with_default`.
pub fn build_subscriber<W>(
    config: &LogConfig,
    writer: W,
    ansi: bool,
) -> Result<Box<dyn Subscriber + Send + Sync>, Error>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = build_filter(&config.filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    Ok(match config.format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false)
                .finish(),
        ),
    })
}

/// Installs the process-wide subscriber, writing to stderr so that commands printing data on
/// stdout (`berth crds`) stay pipeable. Fails, rather than panicking, when one is already installed.
///
/// No thread of the process writes to stderr itself: lines go through a bounded queue that a
/// thread of its own writes out ([`crate::writer`]), so a stalled stderr (a throttled log file, a
/// full pipe) drops lines instead of stalling the threads that log. Keep the returned guard in
/// `main` until the end, so queued lines are written out on exit.
pub fn init_tracing(config: &LogConfig) -> Result<LogGuard, Error> {
    let ansi = config.format == LogFormat::Text && std::io::stderr().is_terminal();
    let (writer, guard) = build_non_blocking(std::io::stderr(), LOG_QUEUE_LINES);
    build_subscriber(config, writer, ansi)?
        .try_init()
        .map_err(Error::TracingAlreadyInitialized)?;
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn mk_config(format: LogFormat, filter: &str) -> LogConfig {
        LogConfig {
            format,
            filter: filter.to_owned(),
        }
    }

    fn capture(config: &LogConfig, emit: impl FnOnce()) -> String {
        let out = Captured::default();
        let subscriber = build_subscriber(config, out.clone(), false).unwrap();
        tracing::subscriber::with_default(subscriber, emit);
        out.text()
    }

    #[test]
    fn log_format_parses_known_names_case_insensitively() {
        assert_eq!("text".parse::<LogFormat>().unwrap(), LogFormat::Text);
        assert_eq!("JSON".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!(" json ".parse::<LogFormat>().unwrap(), LogFormat::Json);
    }

    #[test]
    fn log_format_rejects_unknown_names() {
        let err = "logfmt".parse::<LogFormat>().unwrap_err();
        assert!(matches!(err, Error::UnknownLogFormat(ref s) if s == "logfmt"));
        assert!(err.to_string().contains("\"logfmt\""));
        assert!("".parse::<LogFormat>().is_err());
    }

    #[test]
    fn log_format_round_trips_through_display() {
        for format in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(format.to_string().parse::<LogFormat>().unwrap(), format);
        }
    }

    #[test]
    fn explicit_level_wins_over_rust_log() {
        assert_eq!(resolve_log_filter(Some("debug"), Some("warn")), "debug");
    }

    #[test]
    fn rust_log_used_when_no_level_given() {
        assert_eq!(
            resolve_log_filter(None, Some("warn,kube=debug")),
            "warn,kube=debug"
        );
    }

    #[test]
    fn blank_values_count_as_unset() {
        assert_eq!(resolve_log_filter(Some("  "), Some("warn")), "warn");
        assert_eq!(resolve_log_filter(Some(""), Some("")), DEFAULT_LOG_FILTER);
        assert_eq!(resolve_log_filter(None, None), DEFAULT_LOG_FILTER);
    }

    #[test]
    fn valid_filters_parse() {
        for directives in [
            "info",
            "warn,berth_controller=debug",
            "berth[reconcile]=trace",
            "off",
        ] {
            build_filter(directives).unwrap();
        }
    }

    #[test]
    fn malformed_filters_are_errors() {
        let err = build_filter("berth=notalevel").unwrap_err();
        assert!(
            matches!(err, Error::InvalidLogFilter { ref filter, .. } if filter == "berth=notalevel")
        );
    }

    #[test]
    fn building_a_subscriber_with_a_bad_filter_fails() {
        let result = build_subscriber(&mk_config(LogFormat::Json, "x=nope"), io::sink, false);
        assert!(matches!(result, Err(Error::InvalidLogFilter { .. })));
    }

    #[test]
    fn json_lines_carry_flattened_fields_and_the_current_span() {
        let out = capture(&mk_config(LogFormat::Json, "info"), || {
            let span = tracing::info_span!("reconcile", ns = "default", name = "web");
            let _guard = span.enter();
            tracing::info!(ip = "10.96.0.10", "allocated");
        });
        let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["message"], "allocated");
        assert_eq!(line["ip"], "10.96.0.10");
        assert_eq!(line["span"]["name"], "reconcile");
        assert_eq!(line["span"]["ns"], "default");
    }

    #[test]
    fn text_lines_are_plain_when_ansi_is_off() {
        let out = capture(&mk_config(LogFormat::Text, "info"), || {
            tracing::warn!(port = 30080, "port taken");
        });
        assert!(out.contains("WARN"), "{out}");
        assert!(out.contains("port taken"), "{out}");
        assert!(out.contains("port=30080"), "{out}");
        assert!(!out.contains('\u{1b}'), "escape codes in {out:?}");
    }

    #[test]
    fn filter_drops_events_below_the_level() {
        let out = capture(&mk_config(LogFormat::Json, "warn"), || {
            tracing::info!("hidden");
            tracing::warn!("shown");
        });
        assert!(!out.contains("hidden"), "{out}");
        assert!(out.contains("shown"), "{out}");
    }

    #[test]
    fn per_target_directives_apply() {
        let out = capture(&mk_config(LogFormat::Json, "warn,berth_ipam=debug"), || {
            tracing::debug!(target: "berth_ipam", "ipam detail");
            tracing::debug!(target: "berth_other", "other detail");
        });
        assert!(out.contains("ipam detail"), "{out}");
        assert!(!out.contains("other detail"), "{out}");
    }
}
