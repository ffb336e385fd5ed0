//! berth-lab
