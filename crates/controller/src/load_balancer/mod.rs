//! Load balancers: one provider per class behind one trait.

mod provider;

pub use provider::{
    build_l2_ingress, eligible_nodes, L2Provider, LbRequest, Provider, ProviderError,
};
