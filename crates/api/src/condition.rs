//! Status conditions, updated the way Kubernetes expects: `lastTransitionTime` moves only when
//! the status really changes, so watchers can tell a flap from a refresh.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The longest condition message the API server accepts (`metav1.Condition` validation), in
/// bytes.
pub const MAX_CONDITION_MESSAGE: usize = 32 * 1024;
/// The longest Event note the API server accepts (events.k8s.io/v1 validation), in bytes.
pub const MAX_EVENT_NOTE: usize = 1024;
/// What ends a text cut short by [`bounded`].
const CUT: &str = "...";

/// `text` cut to at most `max` bytes on a UTF-8 character boundary, ending in `...` when cut,
/// so user text (annotation values, names) that flows into a status or an Event never makes
/// the API server refuse the write.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let room = max.saturating_sub(CUT.len());
    let mut end = room.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + CUT.len());
    out.push_str(&text[..end]);
    if max >= CUT.len() {
        out.push_str(CUT);
    }
    out
}

/// Puts `new` in place of the condition of the same type (or appends it); its message is
/// bounded to [`MAX_CONDITION_MESSAGE`]. When the status is
/// unchanged the existing `lastTransitionTime` is kept. Returns whether the list changed, so a
/// caller can skip a status write that would change nothing.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    if new.message.len() > MAX_CONDITION_MESSAGE {
        new.message = bounded(&new.message, MAX_CONDITION_MESSAGE);
    }
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
    fn bounded_cuts_on_a_character_boundary() {
        // (text, max, want)
        let rows: &[(&str, usize, &str)] = &[
            ("short", 10, "short"),
            ("exactly10!", 10, "exactly10!"),
            ("eleven byte", 10, "eleven ..."),
            // "é" is two bytes: a cut inside it moves back before it.
            ("aaaaaéééé", 9, "aaaaa..."),
            ("aaaaaaébc", 9, "aaaaaa..."),
            // Four-byte characters.
            ("🚢🚢🚢", 9, "🚢..."),
            ("🚢🚢🚢", 6, "..."),
            ("abcdef", 2, ""),
            ("", 0, ""),
        ];
        for (text, max, want) in rows {
            let got = bounded(text, *max);
            assert_eq!(got, *want, "{text:?} to {max}");
            assert!(got.len() <= *max, "{text:?} to {max}: {got:?}");
        }
    }

    #[test]
    fn a_condition_message_is_bounded() {
        let mut conditions = Vec::new();
        let mut c = mk_condition(VALID, FALSE, reason::INVALID_SPEC, 10);
        c.message = "é".repeat(MAX_CONDITION_MESSAGE);
        set_condition(&mut conditions, c);
        let m = &conditions[0].message;
        assert!(
            m.len() <= MAX_CONDITION_MESSAGE && m.ends_with("..."),
            "{}",
            m.len()
        );
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
