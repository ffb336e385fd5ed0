//! berth-aws: AWS Network Load Balancers for `type: LoadBalancer` Services of class
//! `berth.dev/aws-nlb`, one NLB per Service whose targets are the nodes' node ports.
//!
//! (Service, eligible nodes, config) -> [`model::build_stack`] (pure) -> [`plan::plan_stack`]
//! against what exists (pure) -> [`provider::NlbProvider`] applies the steps through the
//! [`elbv2::Elbv2`] trait: [`sdk::SdkElbv2`] is the real client, [`memory::MemoryElbv2`] the
//! fake that enforces AWS's rules.
//!
//! # Decisions
//!
//! - **Ownership by tags**: `berth.dev/cluster`, `berth.dev/service` (`<ns>/<name>`) and
//!   `berth.dev/resource` (`LoadBalancer`, or `<port>/<protocol>` for a target group). A
//!   resource without this cluster's tag is never changed or deleted, whatever its name.
//! - **Names** derive from the cluster, the Service's UID and what AWS cannot change in place
//!   ([`names`]); a change to one of those yields a new name, and the resource is replaced.
//! - **Look up before create**: every name the Service's NLB may have is looked up (one name
//!   per call, since DescribeLoadBalancers fails whole when one name is unknown), and target
//!   groups without a listener are found by name. A crash between two calls is therefore
//!   adopted by the next reconcile, never duplicated. moto would accept duplicates; berth
//!   does not rely on AWS to refuse them.
//! - **A steady state makes no call at all**: a Service whose model has not changed since it
//!   converged is answered from memory until `verify_after` passes; the periodic
//!   [`provider::NlbProvider::sweep`] lists the account once (paged, DescribeTags per 20),
//!   removes what belongs to Services that no longer exist, and marks Services one of whose
//!   resources vanished so their next ensure reads AWS again and recreates it. A caller lists
//!   AWS before it reads the Services ([`provider::NlbProvider::list_for_sweep`]), so a
//!   Service created between the two reads is live and its new NLB is not taken for a leak.
//! - **TCP and UDP on one port** become one `TCP_UDP` listener and target group; the two
//!   node ports must then be equal (berth's allocator gives a Service one number for both).
//! - **Health checks**: `externalTrafficPolicy: Local` -> HTTP `/healthz` on
//!   `healthCheckNodePort`; otherwise TCP on the traffic port; the `healthcheck-*`
//!   annotations override, as the AWS Load Balancer Controller reads them.
//! - **Subnets** are IDs: from the `aws-load-balancer-subnets` annotation, else the controller's
//!   `--aws-subnets`, else discovered by their tags as the AWS Load Balancer Controller does
//!   ([`subnets`]; one `ec2:DescribeSubnets` per scheme, kept for `verify_after`).

pub mod annotations;
pub mod ec2;
pub mod elbv2;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod names;
pub mod observed;
pub mod plan;
pub mod provider;
pub mod sdk;
mod sdk_error;
pub mod subnets;

pub use elbv2::{ApiError, ApiErrorKind, Elbv2};
pub use memory::MemoryElbv2;
pub use model::{
    build_stack, instance_id, IpTargets, ModelError, NodeFacts, PortFacts, ProviderConfig,
    ServiceFacts, Stack,
};
pub use plan::{plan_delete, plan_stack, Step};
pub use provider::{Ensured, Error, NlbProvider, SweepListing, Swept};
pub use sdk::{CallTimeouts, RateLimits, SdkElbv2};
