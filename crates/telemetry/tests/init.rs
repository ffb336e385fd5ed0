//! Installing the global subscriber: its own test binary, since the subscriber is process-wide.

use berth_telemetry::{init_tracing, Error, LogConfig, LogFormat};

#[test]
fn second_init_is_an_error_not_a_panic() {
    let config = LogConfig {
        format: LogFormat::Json,
        filter: "warn".to_owned(),
    };
    init_tracing(&config).unwrap();
    let err = init_tracing(&config).unwrap_err();
    assert!(matches!(err, Error::TracingAlreadyInitialized(_)), "{err}");
}

#[test]
fn bad_filter_is_reported_before_anything_is_installed() {
    let config = LogConfig {
        format: LogFormat::Text,
        filter: "berth=loud".to_owned(),
    };
    assert!(matches!(
        init_tracing(&config),
        Err(Error::InvalidLogFilter { .. })
    ));
}
