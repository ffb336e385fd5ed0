//! berth-endpoints
