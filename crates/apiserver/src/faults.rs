//! Fault injection: errors on mutating calls, added latency, dropped watches. Settings change at run
//! time through `/lab/faults`; outcomes come from a seeded generator so a failing run can be replayed.

use super::error::ApiError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Faults {
    /// Probability that a create, update, patch or delete fails instead of running.
    pub error_rate: f64,
    /// Of those failures, the share answered 429 with `Retry-After` (the rest are 500).
    pub throttle_share: f64,
    pub retry_after_seconds: u64,
    /// Added before every API request.
    pub latency_ms: u64,
    /// Probability that an open watch is closed at each wake-up (a batch of changes or a 1 s tick).
    pub watch_drop_rate: f64,
    pub seed: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            error_rate: 0.0,
            throttle_share: 0.5,
            retry_after_seconds: 1,
            latency_ms: 0,
            watch_drop_rate: 0.0,
            seed: 1,
        }
    }
}

impl Faults {
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("errorRate", self.error_rate),
            ("throttleShare", self.throttle_share),
            ("watchDropRate", self.watch_drop_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be between 0 and 1, got {v}"));
            }
        }
        Ok(())
    }

    pub fn latency(&self) -> Option<Duration> {
        (self.latency_ms > 0).then(|| Duration::from_millis(self.latency_ms))
    }
}

#[derive(Debug)]
pub struct FaultState {
    faults: Faults,
    rng: StdRng,
}

impl FaultState {
    pub fn new(faults: Faults) -> Self {
        let rng = StdRng::seed_from_u64(faults.seed);
        Self { faults, rng }
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// New settings restart the generator from their seed.
    pub fn set(&mut self, faults: Faults) {
        *self = Self::new(faults);
    }

    /// The injected failure for one mutating call, if any.
    pub fn mutation_error(&mut self) -> Option<ApiError> {
        if self.faults.error_rate <= 0.0 || !self.rng.random_bool(self.faults.error_rate) {
            return None;
        }
        if self.rng.random_bool(self.faults.throttle_share) {
            Some(ApiError::too_many_requests(self.faults.retry_after_seconds))
        } else {
            Some(ApiError::internal(
                "injected fault: the lab API server failed this request on purpose",
            ))
        }
    }

    pub fn drop_watch(&mut self) -> bool {
        self.faults.watch_drop_rate > 0.0 && self.rng.random_bool(self.faults.watch_drop_rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_faults_by_default() {
        let mut s = FaultState::new(Faults::default());
        assert!((0..1000).all(|_| s.mutation_error().is_none() && !s.drop_watch()));
    }

    #[test]
    fn rates_are_roughly_honoured_and_seeded() {
        let f = Faults {
            error_rate: 0.3,
            throttle_share: 0.5,
            watch_drop_rate: 0.1,
            seed: 7,
            ..Faults::default()
        };
        let run = |f: &Faults| {
            let mut s = FaultState::new(f.clone());
            (0..2000)
                .map(|_| s.mutation_error().map(|e| e.code))
                .collect::<Vec<_>>()
        };
        let a = run(&f);
        assert_eq!(a, run(&f), "same seed, same outcomes");
        let errors = a.iter().flatten().count();
        assert!((450..750).contains(&errors), "{errors}");
        let throttled = a.iter().flatten().filter(|c| **c == 429).count();
        assert!(throttled > 100 && throttled < errors);
    }

    #[test]
    fn validation() {
        assert!(Faults {
            error_rate: 1.5,
            ..Faults::default()
        }
        .validate()
        .is_err());
        assert!(Faults::default().validate().is_ok());
        let parsed: Faults = serde_json::from_str(r#"{"errorRate": 0.2}"#).unwrap();
        assert_eq!(parsed.error_rate, 0.2);
        assert_eq!(parsed.retry_after_seconds, 1);
    }
}
