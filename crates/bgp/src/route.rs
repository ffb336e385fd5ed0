//! The dynamic channel: one route per announced prefix, written by netlink, that FRR's zebra
//! sees and bgpd redistributes (`redistribute kernel route-map berth-announced`).
//!
//! The routes point at `berth-bgp`, a TUN device that exists only while the process that made it
//! holds it open. The kernel deletes the device, and every route through it, the instant that
//! process dies, SIGKILL included, so a dead agent's addresses are withdrawn within one BGP
//! UPDATE while its session, and every other node's routes, stay up. Traffic that reaches the
//! node for an announced address is DNATed by the datapath before routing; whatever is left
//! (a port no Service uses) routes into the device and is dropped, as a blackhole would.
//!
//! Why not `ip import-table N` with a table of berth's own (the first design): FRR 8.4's zebra
//! keeps an imported route after its source route vanished with its interface, so a killed
//! agent's addresses stayed announced; kernel routes in the main table are withdrawn at once.

use std::collections::BTreeSet;
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::route::{RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

use crate::Error;

/// The device berth's routes point at; FRR's route-map matches it.
pub const BERTH_INTERFACE: &str = "berth-bgp";
/// The routing protocol number on berth's routes (`ip route ... proto 250`), so they are told
/// apart from anything else on the device.
pub const ROUTE_PROTOCOL: u8 = 250;

/// Routes to add and delete to turn `current` into `desired`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutePlan {
    pub add: Vec<IpNet>,
    pub delete: Vec<IpNet>,
}

impl RoutePlan {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.delete.is_empty()
    }
}

/// The difference between the routes present and those wanted.
pub fn plan_routes(current: &BTreeSet<IpNet>, desired: &BTreeSet<IpNet>) -> RoutePlan {
    RoutePlan {
        add: desired.difference(current).copied().collect(),
        delete: current.difference(desired).copied().collect(),
    }
}

/// The kernel side: the TUN device (held for the life of this value) and its routes.
pub struct KernelRoutes {
    handle: Handle,
    index: u32,
    /// Closing it deletes the device and its routes.
    _device: std::fs::File,
}

impl KernelRoutes {
    /// Creates `berth-bgp` in the current network namespace, brings it up, and connects to
    /// rtnetlink. Needs CAP_NET_ADMIN and a tokio runtime.
    pub async fn open() -> Result<Self, Error> {
        let device = crate::tun::open_tun(BERTH_INTERFACE)?;
        let (connection, handle, _) = rtnetlink::new_connection().map_err(Error::Netlink)?;
        tokio::spawn(connection);
        let link = handle
            .link()
            .get()
            .match_name(BERTH_INTERFACE.to_string())
            .execute()
            .try_next()
            .await
            .map_err(|source| Error::Route {
                what: "finding the berth-bgp device",
                source,
            })?
            .ok_or(Error::NoDevice)?;
        let index = link.header.index;
        handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(|source| Error::Route {
                what: "bringing berth-bgp up",
                source,
            })?;
        Ok(Self {
            handle,
            index,
            _device: device,
        })
    }

    /// berth's routes on the device, both families.
    pub async fn fetch_routes(&self) -> Result<BTreeSet<IpNet>, Error> {
        let mut found = BTreeSet::new();
        for query in [
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let mut routes = self.handle.route().get(query).execute();
            while let Some(route) = routes.try_next().await.map_err(|source| Error::Route {
                what: "listing routes",
                source,
            })? {
                if let Some(net) = self.ours(&route) {
                    found.insert(net);
                }
            }
        }
        Ok(found)
    }

    fn ours(&self, route: &RouteMessage) -> Option<IpNet> {
        if route.header.protocol != RouteProtocol::Other(ROUTE_PROTOCOL) {
            return None;
        }
        let mut on_device = false;
        let mut destination = None;
        for attribute in &route.attributes {
            match attribute {
                RouteAttribute::Oif(index) => on_device = *index == self.index,
                RouteAttribute::Destination(address) => destination = route_address(address),
                _ => {}
            }
        }
        let ip = destination.filter(|_| on_device)?;
        IpNet::new(ip, route.header.destination_prefix_length).ok()
    }

    /// Makes the device's routes exactly `desired`; returns what it changed.
    pub async fn apply_routes(&self, desired: &BTreeSet<IpNet>) -> Result<RoutePlan, Error> {
        let plan = plan_routes(&self.fetch_routes().await?, desired);
        for net in &plan.add {
            let route = self.message(*net)?;
            self.handle
                .route()
                .add(route)
                .replace()
                .execute()
                .await
                .map_err(|source| Error::Route {
                    what: "adding a route",
                    source,
                })?;
        }
        for net in &plan.delete {
            let route = self.message(*net)?;
            self.handle
                .route()
                .del(route)
                .execute()
                .await
                .map_err(|source| Error::Route {
                    what: "deleting a route",
                    source,
                })?;
        }
        Ok(plan)
    }

    fn message(&self, net: IpNet) -> Result<RouteMessage, Error> {
        Ok(RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(net.addr(), net.prefix_len())
            .map_err(|_| Error::Prefix(net))?
            .output_interface(self.index)
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL))
            .scope(netlink_packet_route::route::RouteScope::Link)
            .build())
    }
}

fn route_address(address: &netlink_packet_route::route::RouteAddress) -> Option<IpAddr> {
    use netlink_packet_route::route::RouteAddress;
    match address {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<IpNet> {
        items.iter().map(|s| s.parse().expect("prefix")).collect()
    }

    #[test]
    fn plan_adds_and_deletes_only_the_difference() {
        let plan = plan_routes(
            &set(&["198.19.10.5/32", "198.19.10.6/32"]),
            &set(&["198.19.10.6/32", "fd00:19:10::8/128"]),
        );
        assert_eq!(
            plan.add,
            set(&["fd00:19:10::8/128"]).into_iter().collect::<Vec<_>>()
        );
        assert_eq!(
            plan.delete,
            set(&["198.19.10.5/32"]).into_iter().collect::<Vec<_>>()
        );
        assert!(plan_routes(&set(&["198.19.10.5/32"]), &set(&["198.19.10.5/32"])).is_empty());
    }
}
