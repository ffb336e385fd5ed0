//! berth-ipam: the ClusterIP, NodePort and LoadBalancer-IP allocators.
//!
//! Pure and single-writer: no Kubernetes client, no async runtime, no I/O. The controller
//! rebuilds state from the Services themselves (adopting what is already set, oldest
//! Service first) and then drives these allocators with plain data.
//!
//! - [`ClusterIpAllocator`] and [`plan_cluster_ips`]: `--service-cidr`, `ipFamilies`,
//!   `ipFamilyPolicy`, with the API server's static band and wording.
//! - [`NodePortAllocator`]: `--node-port-range`, one owner per port number.
//! - [`LbIpAllocator`]: IPPools, requested addresses, named pools, priority, sharing.
//!
//! Randomness is injected as a seeded [`rand::rngs::SmallRng`], so every run can be
//! replayed.
//!
//! # Decisions where the design leaves room
//!
//! - **Owners** are any `Clone + Eq + Hash + Ord + Display` key; [`ServiceKey`] is the usual
//!   one. Every request is idempotent for an owner (asking again for what it holds changes
//!   nothing), so a reconcile whose write failed can simply run again. The ClusterIP and
//!   LoadBalancer allocators intern owners to dense ids on entry (one hash and compare of
//!   the key per call); state behind that is indexed by id. A forgotten owner's slot, and
//!   its key's buffers, are reused by the next new owner, so memory follows the peak number
//!   of owners.
//! - **Release**: `release(address)` frees one value and is idempotent;
//!   `release_owner(owner)` frees everything the owner holds at once and forgets it.
//! - **Adoption** (`adopt`, `adopt_all`) records values found on existing Services; called
//!   oldest first, the first claimant keeps a value and later ones get the conflict error.
//!   Nothing assigned afterwards can take an adopted value.
//! - **ClusterIP**: IPv4 ranges lose the network and broadcast addresses, IPv6 ranges only
//!   the network address. State is a bitmap up to 4 Mi addresses and run-length sets beyond,
//!   so an IPv6 /64 or /48 costs memory per allocation, not per address. An owner holds at
//!   most one address per family; asking for another of the same family is refused
//!   ([`Error::ClusterIpImmutable`]).
//! - **NodePort**: [`NodePortAllocator::assign_service`] mirrors the API server: entries with
//!   the same Service port share a node port (TCP and UDP on 53), a requested node port is
//!   reserved, `healthCheckNodePort` is reserved or allocated and never equals a traffic
//!   port, and the owner ends up holding exactly what the Service uses.
//! - **LoadBalancer pools**: priority set sorts before priority unset, lower first, then
//!   name. `autoAssign: false` pools serve only Services that name them or one of their
//!   addresses. A named pool and a requested address must both admit the Service
//!   (`namespaces`, `namespaceSelector(s)`, `serviceSelector(s)`). A Service keeps the
//!   address it holds while an eligible pool still contains it. Within a pool the lowest
//!   usable address wins; for a Service with a sharing key an address already shared
//!   compatibly counts as usable. `avoidBuggyIPs` skips every IPv4 `.0` and `.255`.
//!   Each pool keeps its own index of its addresses in use (a bitmap up to 4 Mi addresses,
//!   run-length beyond), updated for every pool containing an address as it is taken or
//!   freed, so the lowest free address is a lookup in that pool alone.
//! - **Sharing**: same sharing key, no port in common per protocol, and either both
//!   Services use `externalTrafficPolicy: Cluster` or both have the same selector in the same
//!   namespace. A key does not cross namespaces unless both Services name the other's
//!   namespace (or `*`) in `berth.dev/sharing-cross-namespace` (Cilium's precedent): a tenant
//!   that learns another's key can neither land on its address nor request it.
//! - **Pool changes**: [`LbIpAllocator::set_pools`] replaces all pools or none; addresses
//!   that no longer lie in any pool stay held and are reported as [`Orphan`]s; nothing moves
//!   silently. The controller decides whether their Services keep them: [`LbIpAllocator::check`]
//!   says what `assign` would give without giving it, and [`LbIpAllocator::keep`] records an
//!   address held outside every pool (adoption refuses one), so nobody else is given it and a
//!   pool re-created with it counts it again.
//! - **Counts** per pool and family are kept exact ([`PoolStatus`]): an address in use counts
//!   as assigned in every pool that contains it (pools may overlap; see
//!   [`LbIpAllocator::overlapping_pools`]).

mod band;
mod cluster_ip;
mod cluster_ip_plan;
mod error;
mod hash;
mod lb;
mod node_port;
mod offsets;
mod owners;
mod pool;
mod runset;
mod sharing;
mod types;

pub use cluster_ip::{ClusterIpAllocator, ServiceRange};
pub use cluster_ip_plan::{plan_cluster_ips, ClusterIpPlan, ClusterIpRequest, ClusterIpSlot};
pub use error::{Error, PortField};
pub use lb::{LbIpAllocator, Orphan, ServiceView};
pub use node_port::{NodePortAllocator, NodePortAssignment, NodePortRequest, ServicePortSpec};
pub use pool::{PoolSpec, PoolStatus};
pub use sharing::LbPort;
pub use types::{OwnerKey, ServiceKey};
