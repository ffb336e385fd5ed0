//! Load balancers: one provider per class behind one trait.

pub mod aws;
mod provider;

pub use aws::{aws_runner, AwsLoopConfig, AwsRunner};
pub use provider::{
    build_l2_ingress, eligible_nodes, L2Provider, LbRequest, Provider, ProviderError,
};
