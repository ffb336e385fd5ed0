//! berth-telemetry
