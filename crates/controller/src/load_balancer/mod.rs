//! Load balancers: one provider per class behind one trait.

pub mod aws;
pub mod aws_fence;
mod provider;

pub use aws::{aws_runner, AwsLoopConfig, AwsRunner};
pub use aws_fence::Fenced;
pub use provider::{
    build_l2_ingress, eligible_nodes, L2Provider, LbRequest, Provider, ProviderError,
};
