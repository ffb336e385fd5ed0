//! berth-ipam
