//! Status conditions, updated the way Kubernetes expects: `lastTransitionTime` moves only when
//! the status really changes, so watchers can tell a flap from a refresh.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Puts `new` in place of the condition of the same type (or appends it). When the status is
/// unchanged the existing `lastTransitionTime` is kept. Returns whether the list changed, so a
/// caller can skip a status write that would change nothing.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            if *existing == new {
                return false;
            }
            *existing = new;
            true
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::condition::{reason, FALSE, OVERLAPPING, TRUE, VALID};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn mk_condition(type_: &str, status: &str, reason: &str, at: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::from_second(at).unwrap()),
        }
    }

    #[test]
    fn appends_a_new_type() {
        let mut conditions = vec![mk_condition(VALID, TRUE, reason::VALID_SPEC, 10)];
        assert!(set_condition(
            &mut conditions,
            mk_condition(OVERLAPPING, FALSE, reason::NO_OVERLAP, 20)
        ));
        assert_eq!(conditions.len(), 2);
    }

    #[test]
    fn same_status_keeps_the_transition_time() {
        let mut conditions = vec![mk_condition(OVERLAPPING, FALSE, reason::NO_OVERLAP, 10)];
        assert!(!set_condition(
            &mut conditions,
            mk_condition(OVERLAPPING, FALSE, reason::NO_OVERLAP, 99)
        ));
        assert_eq!(conditions[0].last_transition_time.0.as_second(), 10);

        let mut newer = mk_condition(OVERLAPPING, FALSE, reason::NO_OVERLAP, 99);
        newer.observed_generation = Some(2);
        assert!(set_condition(&mut conditions, newer));
        assert_eq!(conditions[0].observed_generation, Some(2));
        assert_eq!(conditions[0].last_transition_time.0.as_second(), 10);
    }

    #[test]
    fn status_change_moves_the_transition_time() {
        let mut conditions = vec![mk_condition(OVERLAPPING, FALSE, reason::NO_OVERLAP, 10)];
        assert!(set_condition(
            &mut conditions,
            mk_condition(OVERLAPPING, TRUE, reason::OVERLAPS_POOL, 50)
        ));
        let c = find_condition(&conditions, OVERLAPPING).unwrap();
        assert_eq!(
            (c.status.as_str(), c.last_transition_time.0.as_second()),
            (TRUE, 50)
        );
        assert!(find_condition(&conditions, VALID).is_none());
    }
}
