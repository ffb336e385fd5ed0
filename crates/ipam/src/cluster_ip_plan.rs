//! The API server's rules for deciding a Service's `ipFamilyPolicy`, `ipFamilies` and
//! ClusterIPs (`initIPFamilyFields` + the clusterIPs validation), as one pure function.

use std::net::IpAddr;

use berth_core::{
    quoted, quoted_list, FieldError, FieldErrorKind, FieldErrors, IpFamily, IpFamilyPolicy,
};

use crate::error::Error;

/// The ClusterIP-related fields of a Service that is not ExternalName (which gets nothing
/// and need not be planned).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterIpRequest {
    /// `spec.ipFamilyPolicy`, unset = `None`.
    pub policy: Option<IpFamilyPolicy>,
    /// `spec.ipFamilies`, in order.
    pub families: Vec<IpFamily>,
    /// `spec.clusterIPs` already set or requested, in order; empty when unset. A headless
    /// Service (`clusterIP: None`) sets `headless` instead.
    pub cluster_ips: Vec<IpAddr>,
    /// `spec.clusterIP` is `None`.
    pub headless: bool,
    /// `spec.selector` is non-empty.
    pub has_selector: bool,
}

/// What one entry of `spec.clusterIPs` will be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterIpSlot {
    /// The Service names this address (requested, or already allocated): reserve it.
    Requested(IpAddr),
    /// Allocate a free address of this family.
    Allocate(IpFamily),
}

/// The defaulted families and policy, and what to allocate for each family, in
/// `ipFamilies` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterIpPlan {
    pub policy: IpFamilyPolicy,
    pub families: Vec<IpFamily>,
    /// One per family; empty for headless Services.
    pub slots: Vec<ClusterIpSlot>,
}

/// Decides a Service's `ipFamilyPolicy`, `ipFamilies` and ClusterIPs on a cluster whose
/// service CIDRs have the families `configured` (in `--service-cidr` order: the first is
/// the default family). Mirrors the API server on create, including its error wording.
pub fn plan_cluster_ips(
    req: &ClusterIpRequest,
    configured: &[IpFamily],
) -> Result<ClusterIpPlan, Error> {
    let selectorless_headless = req.headless && !req.has_selector;
    let policy = req.policy.unwrap_or(if selectorless_headless {
        IpFamilyPolicy::RequireDualStack
    } else {
        IpFamilyPolicy::SingleStack
    });
    let is_configured = |f: IpFamily| configured.contains(&f);
    let mut errs = validate_fields(req);
    if !errs.is_empty() {
        return Err(Error::Invalid(FieldErrors(errs)));
    }

    if policy == IpFamilyPolicy::SingleStack {
        let policy_value = quoted(policy.as_str());
        if req.cluster_ips.len() == 2 {
            errs.push(FieldError::invalid(
                "spec.ipFamilyPolicy",
                policy_value.clone(),
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified",
            ));
        }
        if req.families.len() == 2 {
            errs.push(FieldError::invalid(
                "spec.ipFamilyPolicy",
                policy_value,
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified",
            ));
        }
    }

    // Families are inferred from the addresses the user named.
    let mut families = req.families.clone();
    for (i, ip) in req.cluster_ips.iter().enumerate() {
        if i < families.len() {
            continue;
        }
        let fam = IpFamily::of(*ip);
        if is_configured(fam) {
            families.push(fam);
        } else {
            errs.push(FieldError::invalid(
                format!("spec.clusterIPs[{i}]"),
                quoted_list(&req.cluster_ips),
                format!("{fam} is not configured on this cluster"),
            ));
        }
    }
    if !errs.is_empty() {
        return Err(Error::Invalid(FieldErrors(errs)));
    }

    let default_family = configured.first().copied().unwrap_or(IpFamily::V4);

    // Selectorless headless Services may name families the cluster lacks: they get no IP.
    if selectorless_headless {
        if families.is_empty() {
            families.push(default_family);
        }
        if families.len() < 2 && policy != IpFamilyPolicy::SingleStack {
            families.push(families[0].other());
        }
        return Ok(ClusterIpPlan {
            policy,
            families,
            slots: Vec::new(),
        });
    }

    if policy == IpFamilyPolicy::RequireDualStack && configured.len() < 2 {
        errs.push(FieldError::invalid(
            "spec.ipFamilyPolicy",
            quoted(policy.as_str()),
            "this cluster is not configured for dual-stack services",
        ));
    }
    for (i, fam) in families.iter().enumerate() {
        if !is_configured(*fam) {
            errs.push(FieldError::invalid(
                format!("spec.ipFamilies[{i}]"),
                quoted(fam.as_str()),
                "not configured on this cluster",
            ));
        }
    }
    if !errs.is_empty() {
        return Err(Error::Invalid(FieldErrors(errs)));
    }

    if families.is_empty() {
        families.push(default_family);
    }
    if policy != IpFamilyPolicy::SingleStack && families.len() == 1 && configured.len() == 2 {
        families.push(families[0].other());
    }

    let slots = if req.headless {
        Vec::new()
    } else {
        families
            .iter()
            .enumerate()
            .map(|(i, fam)| match req.cluster_ips.get(i) {
                Some(ip) => ClusterIpSlot::Requested(*ip),
                None => ClusterIpSlot::Allocate(*fam),
            })
            .collect()
    };
    Ok(ClusterIpPlan {
        policy,
        families,
        slots,
    })
}

/// The stand-alone checks of `ipFamilies` and `clusterIPs`.
fn validate_fields(req: &ClusterIpRequest) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if req.families.len() > 2 {
        errs.push(FieldError {
            path: "spec.ipFamilies".into(),
            kind: FieldErrorKind::TooMany {
                count: req.families.len(),
                max: 2,
            },
        });
    }
    for (i, fam) in req.families.iter().enumerate() {
        if req.families[..i].contains(fam) {
            errs.push(FieldError {
                path: format!("spec.ipFamilies[{i}]"),
                kind: FieldErrorKind::Duplicate {
                    value: quoted(fam.as_str()),
                },
            });
        }
    }
    if req.headless && !req.cluster_ips.is_empty() {
        let mut shown = vec!["None".to_string()];
        shown.extend(req.cluster_ips.iter().map(ToString::to_string));
        errs.push(FieldError::invalid(
            "spec.clusterIPs",
            quoted_list(&shown),
            "'None' must be the first and only value",
        ));
        return errs;
    }
    if req.cluster_ips.len() > 2 {
        errs.push(FieldError::invalid(
            "spec.clusterIPs",
            quoted_list(&req.cluster_ips),
            "may only hold up to 2 values",
        ));
    }
    if req.cluster_ips.len() > 1 {
        let v6 = req
            .cluster_ips
            .iter()
            .filter(|ip| IpFamily::of(**ip) == IpFamily::V6)
            .count();
        if v6 == 0 || v6 == req.cluster_ips.len() {
            errs.push(FieldError::invalid(
                "spec.clusterIPs",
                quoted_list(&req.cluster_ips),
                "may specify no more than one IP for each IP family",
            ));
        }
    }
    for (i, (ip, fam)) in req.cluster_ips.iter().zip(&req.families).enumerate() {
        if IpFamily::of(*ip) != *fam {
            errs.push(FieldError::invalid(
                format!("spec.clusterIPs[{i}]"),
                quoted(&ip.to_string()),
                format!("expected an {fam} value as indicated by `ipFamilies[{i}]`"),
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use IpFamily::{V4, V6};
    use IpFamilyPolicy::*;

    fn mk_req(
        policy: Option<IpFamilyPolicy>,
        families: &[IpFamily],
        ips: &[&str],
    ) -> ClusterIpRequest {
        ClusterIpRequest {
            policy,
            families: families.to_vec(),
            cluster_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            headless: false,
            has_selector: true,
        }
    }

    fn err(req: &ClusterIpRequest, configured: &[IpFamily]) -> String {
        plan_cluster_ips(req, configured).unwrap_err().to_string()
    }

    #[test]
    fn defaults_to_single_stack_of_the_first_cidr() {
        let plan = plan_cluster_ips(&mk_req(None, &[], &[]), &[V6, V4]).unwrap();
        assert_eq!(plan.policy, SingleStack);
        assert_eq!(plan.families, vec![V6]);
        assert_eq!(plan.slots, vec![ClusterIpSlot::Allocate(V6)]);
    }

    #[test]
    fn prefer_dual_stack_adds_the_other_family_only_on_dual_stack_clusters() {
        let req = mk_req(Some(PreferDualStack), &[], &[]);
        assert_eq!(
            plan_cluster_ips(&req, &[V4, V6]).unwrap().families,
            vec![V4, V6]
        );
        assert_eq!(plan_cluster_ips(&req, &[V4]).unwrap().families, vec![V4]);
        let req = mk_req(Some(PreferDualStack), &[V6], &[]);
        assert_eq!(
            plan_cluster_ips(&req, &[V4, V6]).unwrap().families,
            vec![V6, V4]
        );
    }

    #[test]
    fn require_dual_stack_on_single_stack_cluster_fails_with_apiserver_words() {
        let req = mk_req(Some(RequireDualStack), &[], &[]);
        assert_eq!(
            err(&req, &[V4]),
            "spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services"
        );
        let plan = plan_cluster_ips(&req, &[V4, V6]).unwrap();
        assert_eq!(
            plan.slots,
            vec![ClusterIpSlot::Allocate(V4), ClusterIpSlot::Allocate(V6)]
        );
    }

    #[test]
    fn unconfigured_family_is_rejected() {
        assert_eq!(
            err(&mk_req(None, &[V6], &[]), &[V4]),
            "spec.ipFamilies[0]: Invalid value: \"IPv6\": not configured on this cluster"
        );
        assert_eq!(
            err(&mk_req(None, &[], &["fd00::1"]), &[V4]),
            "spec.clusterIPs[0]: Invalid value: []string{\"fd00::1\"}: IPv6 is not configured on this cluster"
        );
    }

    #[test]
    fn requested_ips_become_requested_slots_and_infer_families() {
        let plan = plan_cluster_ips(
            &mk_req(Some(PreferDualStack), &[], &["fd00::5", "10.96.0.5"]),
            &[V4, V6],
        )
        .unwrap();
        assert_eq!(plan.families, vec![V6, V4]);
        assert_eq!(
            plan.slots,
            vec![
                ClusterIpSlot::Requested("fd00::5".parse().unwrap()),
                ClusterIpSlot::Requested("10.96.0.5".parse().unwrap())
            ]
        );
        // A single requested address with dual stack gets the second family allocated.
        let plan = plan_cluster_ips(
            &mk_req(Some(RequireDualStack), &[], &["10.96.0.5"]),
            &[V4, V6],
        )
        .unwrap();
        assert_eq!(
            plan.slots,
            vec![
                ClusterIpSlot::Requested("10.96.0.5".parse().unwrap()),
                ClusterIpSlot::Allocate(V6)
            ]
        );
    }

    #[test]
    fn single_stack_with_two_values_is_rejected() {
        assert_eq!(
            err(&mk_req(Some(SingleStack), &[V4, V6], &[]), &[V4, V6]),
            "spec.ipFamilyPolicy: Invalid value: \"SingleStack\": must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"
        );
        assert_eq!(
            err(&mk_req(None, &[], &["10.96.0.5", "fd00::5"]), &[V4, V6]),
            "spec.ipFamilyPolicy: Invalid value: \"SingleStack\": must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified"
        );
    }

    #[test]
    fn field_validation_errors() {
        assert_eq!(
            err(&mk_req(Some(PreferDualStack), &[V4, V4], &[]), &[V4, V6]),
            "spec.ipFamilies[1]: Duplicate value: \"IPv4\""
        );
        assert_eq!(
            err(&mk_req(Some(PreferDualStack), &[], &["10.96.0.5", "10.96.0.6"]), &[V4, V6]),
            "spec.clusterIPs: Invalid value: []string{\"10.96.0.5\", \"10.96.0.6\"}: may specify no more than one IP for each IP family"
        );
        assert_eq!(
            err(&mk_req(None, &[V6], &["10.96.0.5"]), &[V4, V6]),
            "spec.clusterIPs[0]: Invalid value: \"10.96.0.5\": expected an IPv6 value as indicated by `ipFamilies[0]`"
        );
        assert_eq!(
            err(&mk_req(Some(PreferDualStack), &[V4, V6, V4], &[]), &[V4, V6]),
            "[spec.ipFamilies: Too many: 3: must have at most 2 items, spec.ipFamilies[2]: Duplicate value: \"IPv4\"]"
        );
    }

    #[test]
    fn headless_services_get_families_but_no_addresses() {
        let mut req = mk_req(None, &[], &[]);
        req.headless = true;
        req.has_selector = false;
        // Selectorless headless defaults to RequireDualStack, even on a single-stack cluster.
        let plan = plan_cluster_ips(&req, &[V4]).unwrap();
        assert_eq!(plan.policy, RequireDualStack);
        assert_eq!(plan.families, vec![V4, V6]);
        assert!(plan.slots.is_empty());
        req.has_selector = true;
        let plan = plan_cluster_ips(&req, &[V4, V6]).unwrap();
        assert_eq!(
            (plan.policy, plan.families, plan.slots),
            (SingleStack, vec![V4], vec![])
        );
    }

    #[test]
    fn parses_and_prints_api_spellings() {
        for f in [V4, V6] {
            assert_eq!(f.as_str().parse::<IpFamily>().unwrap(), f);
        }
        for p in [SingleStack, PreferDualStack, RequireDualStack] {
            assert_eq!(p.to_string().parse::<IpFamilyPolicy>().unwrap(), p);
        }
        assert!("IPv5".parse::<IpFamily>().is_err());
        assert!("Dual".parse::<IpFamilyPolicy>().is_err());
    }
}
