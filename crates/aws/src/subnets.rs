//! Subnet discovery by tags, as the AWS Load Balancer Controller does it, for Services that
//! name no subnets (no `aws-load-balancer-subnets` annotation, no `--aws-subnets`):
//!
//! - the role tag: `kubernetes.io/role/elb` for `internet-facing`, `kubernetes.io/role/internal-elb`
//!   for `internal`, with the value `1` or empty;
//! - the cluster tag: a subnet tagged `kubernetes.io/cluster/<this cluster>` (`owned` or `shared`)
//!   qualifies, so does one tagged for no cluster at all; one tagged only for other clusters
//!   does not (it is theirs);
//! - at least 8 free addresses (what an NLB needs per subnet);
//! - one subnet per availability zone: the one tagged for this cluster, then the lowest ID;
//! - all in one VPC: candidates in several VPCs are refused rather than guessed between.
//!
//! [`choose_subnets`] is pure; [`SubnetSource`] is the one EC2 call behind it.

use std::collections::BTreeMap;
use std::fmt;

use futures::future::BoxFuture;

use crate::elbv2::ApiError;
use crate::model::Scheme;

/// The role tag for internet-facing load balancers.
pub const ROLE_ELB: &str = "kubernetes.io/role/elb";
/// The role tag for internal load balancers.
pub const ROLE_INTERNAL_ELB: &str = "kubernetes.io/role/internal-elb";
/// Prefix of the cluster tags (`kubernetes.io/cluster/<name>`).
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";
/// Free addresses an NLB needs in each of its subnets.
pub const MIN_FREE_ADDRESSES: i32 = 8;

/// One subnet as EC2 describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetFacts {
    pub id: String,
    pub vpc_id: String,
    pub zone: String,
    pub available_addresses: i32,
    pub tags: BTreeMap<String, String>,
}

/// The one call discovery makes: every subnet carrying `role_tag`.
pub trait SubnetSource: Send + Sync + fmt::Debug {
    fn describe_subnets<'a>(
        &'a self,
        role_tag: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SubnetFacts>, ApiError>>;
}

pub fn role_tag(scheme: Scheme) -> &'static str {
    match scheme {
        Scheme::Internal => ROLE_INTERNAL_ELB,
        Scheme::InternetFacing => ROLE_ELB,
    }
}

/// The subnets chosen and every subnet looked at and left out, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetChoice {
    pub scheme: Scheme,
    /// (subnet, zone, why it qualified), by ID.
    pub chosen: Vec<(String, String, String)>,
    /// (subnet, why not), by ID.
    pub left_out: Vec<(String, String)>,
}

impl SubnetChoice {
    pub fn ids(&self) -> Vec<String> {
        self.chosen.iter().map(|(id, _, _)| id.clone()).collect()
    }
}

impl fmt::Display for SubnetChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let chosen: Vec<String> = self
            .chosen
            .iter()
            .map(|(id, zone, why)| format!("{id} ({zone}, {why})"))
            .collect();
        write!(
            f,
            "subnets found by tag {} for an {} load balancer: {}",
            role_tag(self.scheme),
            self.scheme.as_str(),
            chosen.join(", ")
        )?;
        if !self.left_out.is_empty() {
            let left: Vec<String> = self
                .left_out
                .iter()
                .map(|(id, why)| format!("{id} ({why})"))
                .collect();
            write!(f, "; left out: {}", left.join(", "))?;
        }
        Ok(())
    }
}

/// Why discovery found nothing to use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("no subnet is tagged {tag} (1 or empty) for an {scheme} load balancer{looked}; tag one subnet per availability zone, or set the service.beta.kubernetes.io/aws-load-balancer-subnets annotation or the controller's --aws-subnets", scheme = .scheme.as_str(), looked = looked_at(.left_out))]
    NoneQualifies {
        scheme: Scheme,
        tag: &'static str,
        left_out: Vec<(String, String)>,
    },
    #[error("subnets tagged {tag} in several VPCs ({vpcs}): berth does not guess which is the cluster's; set the service.beta.kubernetes.io/aws-load-balancer-subnets annotation or the controller's --aws-subnets")]
    SeveralVpcs { tag: &'static str, vpcs: String },
}

fn looked_at(left_out: &[(String, String)]) -> String {
    if left_out.is_empty() {
        return String::new();
    }
    let items: Vec<String> = left_out
        .iter()
        .map(|(id, why)| format!("{id}: {why}"))
        .collect();
    format!(" (looked at {})", items.join(", "))
}

/// Whether the role tag's value turns the role on (the AWS Load Balancer Controller reads `1`
/// and empty so).
fn role_on(value: &str) -> bool {
    matches!(value.trim(), "" | "1")
}

/// The subnets an NLB of `scheme` gets in `cluster`, from what EC2 describes.
pub fn choose_subnets(
    subnets: &[SubnetFacts],
    cluster: &str,
    scheme: Scheme,
) -> Result<SubnetChoice, DiscoveryError> {
    let tag = role_tag(scheme);
    let ours = format!("{CLUSTER_TAG_PREFIX}{cluster}");
    let mut left_out = Vec::new();
    // (zone -> (tagged for this cluster, subnet))
    let mut candidates: Vec<(bool, &SubnetFacts)> = Vec::new();
    for subnet in subnets {
        let others: Vec<&str> = subnet
            .tags
            .keys()
            .filter_map(|k| k.strip_prefix(CLUSTER_TAG_PREFIX))
            .filter(|name| *name != cluster)
            .collect();
        let tagged_ours = subnet.tags.contains_key(&ours);
        let why_not = match subnet.tags.get(tag) {
            None => Some(format!("no {tag} tag")),
            Some(v) if !role_on(v) => Some(format!("{tag} is {v:?}, not 1 or empty")),
            _ if !tagged_ours && !others.is_empty() => {
                Some(format!("tagged for another cluster: {}", others.join(", ")))
            }
            _ if subnet.available_addresses < MIN_FREE_ADDRESSES => Some(format!(
                "{} free addresses, fewer than {MIN_FREE_ADDRESSES}",
                subnet.available_addresses
            )),
            _ => None,
        };
        match why_not {
            Some(why) => left_out.push((subnet.id.clone(), why)),
            None => candidates.push((tagged_ours, subnet)),
        }
    }
    let vpcs: std::collections::BTreeSet<&str> =
        candidates.iter().map(|(_, s)| s.vpc_id.as_str()).collect();
    if vpcs.len() > 1 {
        return Err(DiscoveryError::SeveralVpcs {
            tag,
            vpcs: vpcs.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    // Tagged for this cluster first, then the lowest ID: the first of a zone is its subnet.
    candidates.sort_by(|(a_ours, a), (b_ours, b)| b_ours.cmp(a_ours).then(a.id.cmp(&b.id)));
    let mut by_zone: BTreeMap<&str, (bool, &SubnetFacts)> = BTreeMap::new();
    for (tagged_ours, subnet) in candidates {
        match by_zone.get(subnet.zone.as_str()) {
            Some((_, first)) => left_out.push((
                subnet.id.clone(),
                format!("{} already chosen in {}", first.id, subnet.zone),
            )),
            None => {
                by_zone.insert(&subnet.zone, (tagged_ours, subnet));
            }
        }
    }
    let mut chosen: Vec<(String, String, String)> = by_zone
        .into_values()
        .map(|(tagged_ours, s)| {
            let why = if tagged_ours {
                let value = s.tags.get(&ours).map(String::as_str).unwrap_or_default();
                format!("tagged {ours}={value}")
            } else {
                "tagged for no cluster".to_string()
            };
            (s.id.clone(), s.zone.clone(), why)
        })
        .collect();
    chosen.sort();
    left_out.sort();
    if chosen.is_empty() {
        return Err(DiscoveryError::NoneQualifies {
            scheme,
            tag,
            left_out,
        });
    }
    Ok(SubnetChoice {
        scheme,
        chosen,
        left_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_subnet(id: &str, zone: &str, tags: &[(&str, &str)]) -> SubnetFacts {
        SubnetFacts {
            id: id.into(),
            vpc_id: "vpc-1".into(),
            zone: zone.into(),
            available_addresses: 250,
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    const OURS: (&str, &str) = ("kubernetes.io/cluster/prod", "owned");
    const SHARED: (&str, &str) = ("kubernetes.io/cluster/prod", "shared");
    const THEIRS: (&str, &str) = ("kubernetes.io/cluster/staging", "owned");
    const INTERNAL: (&str, &str) = (ROLE_INTERNAL_ELB, "1");
    const PUBLIC: (&str, &str) = (ROLE_ELB, "");

    fn ids(r: &Result<SubnetChoice, DiscoveryError>) -> Vec<String> {
        r.as_ref().map(SubnetChoice::ids).unwrap_or_default()
    }

    #[test]
    fn choice_rows() {
        let rows: Vec<(&str, Scheme, Vec<SubnetFacts>, Vec<&str>)> = vec![
            (
                "one per zone, role tag by scheme",
                Scheme::Internal,
                vec![
                    mk_subnet("subnet-a", "us-east-1a", &[INTERNAL, OURS]),
                    mk_subnet("subnet-b", "us-east-1b", &[INTERNAL, SHARED]),
                    mk_subnet("subnet-p", "us-east-1a", &[PUBLIC, OURS]),
                ],
                vec!["subnet-a", "subnet-b"],
            ),
            (
                "the internet-facing role",
                Scheme::InternetFacing,
                vec![
                    mk_subnet("subnet-a", "us-east-1a", &[INTERNAL, OURS]),
                    mk_subnet("subnet-p", "us-east-1a", &[PUBLIC, OURS]),
                ],
                vec!["subnet-p"],
            ),
            (
                "another cluster's subnet is never taken, an untagged one is",
                Scheme::Internal,
                vec![
                    mk_subnet("subnet-0", "us-east-1a", &[INTERNAL, THEIRS]),
                    mk_subnet("subnet-9", "us-east-1a", &[INTERNAL]),
                ],
                vec!["subnet-9"],
            ),
            (
                "shared between clusters, ours among them",
                Scheme::Internal,
                vec![mk_subnet(
                    "subnet-0",
                    "us-east-1a",
                    &[INTERNAL, THEIRS, SHARED],
                )],
                vec!["subnet-0"],
            ),
            (
                "in one zone, tagged for this cluster beats a lower untagged ID",
                Scheme::Internal,
                vec![
                    mk_subnet("subnet-0", "us-east-1a", &[INTERNAL]),
                    mk_subnet("subnet-5", "us-east-1a", &[INTERNAL, OURS]),
                ],
                vec!["subnet-5"],
            ),
            (
                "then the lowest ID",
                Scheme::Internal,
                vec![
                    mk_subnet("subnet-7", "us-east-1a", &[INTERNAL, OURS]),
                    mk_subnet("subnet-5", "us-east-1a", &[INTERNAL, OURS]),
                ],
                vec!["subnet-5"],
            ),
            (
                "a role tag set to 0 is off",
                Scheme::Internal,
                vec![
                    mk_subnet("subnet-1", "us-east-1a", &[(ROLE_INTERNAL_ELB, "0"), OURS]),
                    mk_subnet("subnet-2", "us-east-1b", &[INTERNAL, OURS]),
                ],
                vec!["subnet-2"],
            ),
        ];
        for (row, scheme, subnets, want) in rows {
            assert_eq!(
                ids(&choose_subnets(&subnets, "prod", scheme)),
                want,
                "{row}"
            );
        }
    }

    #[test]
    fn a_full_subnet_is_left_out_with_its_reason() {
        let mut full = mk_subnet("subnet-1", "us-east-1a", &[INTERNAL, OURS]);
        full.available_addresses = 3;
        let ok = mk_subnet("subnet-2", "us-east-1a", &[INTERNAL]);
        let choice = choose_subnets(&[full, ok], "prod", Scheme::Internal).unwrap();
        assert_eq!(choice.ids(), ["subnet-2"]);
        assert_eq!(
            choice.left_out,
            [(
                "subnet-1".to_string(),
                "3 free addresses, fewer than 8".to_string()
            )]
        );
        assert_eq!(
            choice.to_string(),
            "subnets found by tag kubernetes.io/role/internal-elb for an internal load balancer: \
             subnet-2 (us-east-1a, tagged for no cluster); left out: subnet-1 (3 free addresses, \
             fewer than 8)"
        );
    }

    #[test]
    fn nothing_to_use_is_a_clear_error() {
        let err = choose_subnets(
            &[mk_subnet("subnet-0", "us-east-1a", &[INTERNAL, THEIRS])],
            "prod",
            Scheme::Internal,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "no subnet is tagged kubernetes.io/role/internal-elb (1 or empty) for an internal \
             load balancer (looked at subnet-0: tagged for another cluster: staging); tag one \
             subnet per availability zone, or set the \
             service.beta.kubernetes.io/aws-load-balancer-subnets annotation or the controller's \
             --aws-subnets"
        );
        assert!(matches!(
            choose_subnets(&[], "prod", Scheme::InternetFacing),
            Err(DiscoveryError::NoneQualifies { .. })
        ));
        let mut other_vpc = mk_subnet("subnet-2", "us-east-1b", &[INTERNAL, OURS]);
        other_vpc.vpc_id = "vpc-2".into();
        let err = choose_subnets(
            &[
                mk_subnet("subnet-1", "us-east-1a", &[INTERNAL, OURS]),
                other_vpc,
            ],
            "prod",
            Scheme::Internal,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("several VPCs (vpc-1, vpc-2)"),
            "{err}"
        );
    }
}
