//! `service.kubernetes.io/load-balancer-cleanup`, as upstream's service controller keeps it:
//! on every LoadBalancer Service of a class berth serves, added before its load balancer is
//! made, and removed only once that load balancer is gone, so a deleted Service cannot leave
//! an address announced or a cloud load balancer behind.
//!
//! "Gone" per class: `l2` — the address released and `status.loadBalancer.ingress` cleared
//! (a deleting `l2` Service is read as no longer a LoadBalancer, so the plan does both);
//! `aws-nlb` — its provider's own finalizer `berth.dev/load-balancer` removed, which it does
//! once deletion confirmed nothing is left. A Service of a class berth does not serve is never
//! touched: its finalizer belongs to whoever serves it.

pub use super::facts::CleanupFacts;
use super::facts::LbClass;

/// What to do with the cleanup finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalizerChange {
    Add,
    Remove,
}

/// The change for a Service of class `lb_class` (as read, see the module) that publishes
/// load-balancer ingress or not (`has_ingress`).
pub fn plan_cleanup_finalizer(
    lb_class: &LbClass,
    facts: CleanupFacts,
    has_ingress: bool,
) -> Option<FinalizerChange> {
    let CleanupFacts {
        deleting,
        has_cleanup,
        has_cloud,
    } = facts;
    let wants = match lb_class {
        LbClass::Foreign => return None,
        LbClass::L2 | LbClass::AwsNlb => !deleting,
        LbClass::None => false,
    };
    let gone = match lb_class {
        LbClass::Foreign | LbClass::L2 => false,
        LbClass::AwsNlb => !has_cloud,
        LbClass::None => !has_cloud && !has_ingress,
    };
    if wants && !has_cleanup {
        Some(FinalizerChange::Add)
    } else if !wants && has_cleanup && gone {
        Some(FinalizerChange::Remove)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        use FinalizerChange::{Add, Remove};
        let f = |deleting, has_cleanup, has_cloud| CleanupFacts {
            deleting,
            has_cleanup,
            has_cloud,
        };
        #[rustfmt::skip]
        let rows: &[(&str, LbClass, CleanupFacts, bool, Option<FinalizerChange>)] = &[
            ("l2 without it: added", LbClass::L2, f(false, false, false), false, Some(Add)),
            ("l2 with it: nothing", LbClass::L2, f(false, true, false), true, None),
            ("aws without it: added", LbClass::AwsNlb, f(false, false, false), false, Some(Add)),
            ("aws added before its own finalizer too", LbClass::AwsNlb, f(false, false, true), false, Some(Add)),
            ("aws deleting, load balancer still there", LbClass::AwsNlb, f(true, true, true), true, None),
            ("aws deleting, load balancer gone", LbClass::AwsNlb, f(true, true, false), true, Some(Remove)),
            ("aws deleting without it: not added again", LbClass::AwsNlb, f(true, false, true), true, None),
            // A deleting l2 Service is read as LbClass::None: released, status cleared, then gone.
            ("l2 deleting, status not cleared yet", LbClass::None, f(true, true, false), true, None),
            ("l2 deleting, status cleared", LbClass::None, f(true, true, false), false, Some(Remove)),
            ("type changed away, status still there", LbClass::None, f(false, true, false), true, None),
            ("type changed away, status cleared", LbClass::None, f(false, true, false), false, Some(Remove)),
            ("type changed away from aws, its load balancer still there", LbClass::None, f(false, true, true), false, None),
            ("never a LoadBalancer", LbClass::None, f(false, false, false), false, None),
            ("another class's finalizer is left alone", LbClass::Foreign, f(false, true, false), false, None),
            ("another class's Service gets none", LbClass::Foreign, f(false, false, false), false, None),
            ("another class's deleting Service is left alone", LbClass::Foreign, f(true, true, false), false, None),
        ];
        for (name, class, facts, has_ingress, want) in rows {
            assert_eq!(
                plan_cleanup_finalizer(class, *facts, *has_ingress),
                *want,
                "{name}"
            );
        }
    }
}
