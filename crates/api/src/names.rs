//! Every well-known name berth reads or writes, in one place, so that no component spells a key
//! by hand and a rename is a one-line change.

/// API group of berth's custom resources.
pub const GROUP: &str = "berth.dev";
/// Version of berth's custom resources.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of berth's custom resources.
pub const API_VERSION: &str = "berth.dev/v1alpha1";
/// `kind` of the address pool resource.
pub const KIND_IP_POOL: &str = "IPPool";
/// `kind` of the layer-2 advertisement resource.
pub const KIND_L2_ADVERTISEMENT: &str = "L2Advertisement";
/// `kind` of the record of where a Service is announced over ARP/NDP.
pub const KIND_SERVICE_L2_STATUS: &str = "ServiceL2Status";
/// `kind` of the BGP peer resource.
pub const KIND_BGP_PEER: &str = "BGPPeer";
/// `kind` of the BGP advertisement resource.
pub const KIND_BGP_ADVERTISEMENT: &str = "BGPAdvertisement";
/// `kind` of the BFD profile resource.
pub const KIND_BFD_PROFILE: &str = "BFDProfile";
/// `kind` of the record of one node's session with one BGP peer.
pub const KIND_BGP_SESSION_STATE: &str = "BGPSessionState";
/// `kubectl get berth` lists every berth resource.
pub const CATEGORY: &str = "berth";

/// `spec.loadBalancerClass` values berth serves.
pub mod class {
    /// Bare metal: an IPPool address announced over ARP by one node.
    pub const L2: &str = "berth.dev/l2";
    /// AWS: one Network Load Balancer per Service, targeting the node ports.
    pub const AWS_NLB: &str = "berth.dev/aws-nlb";
    /// Every class berth serves, for `--default-class` validation and eligibility checks.
    pub const ALL: [&str; 2] = [L2, AWS_NLB];

    /// The berth class that serves a LoadBalancer Service with `spec.loadBalancerClass` =
    /// `requested`, given the controller's `--default-class`; `None` leaves it to someone else.
    pub fn served_class(requested: Option<&str>, default: Option<&str>) -> Option<&'static str> {
        let class = requested.or(default)?;
        ALL.into_iter().find(|c| *c == class)
    }
}

/// Annotations berth reads on Services.
pub mod annotation {
    /// Upstream's topology-aware routing switch (`Auto`): kube-controller-manager then writes
    /// CPU-proportional zone hints and ignores `spec.trafficDistribution`.
    pub const TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
    /// [`TOPOLOGY_MODE`]'s predecessor, read the same way.
    pub const TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
    /// Requested LoadBalancer IPs, comma separated, at most one per family.
    pub const LOAD_BALANCER_IPS: &str = "berth.dev/load-balancer-ips";
    /// Name of the IPPool the LoadBalancer IP must come from.
    pub const IP_POOL: &str = "berth.dev/ip-pool";
    /// Services with the same key may share a LoadBalancer IP.
    pub const SHARING_KEY: &str = "berth.dev/sharing-key";
    /// Other namespaces (comma separated, or `*`) whose Services may share this Service's
    /// LoadBalancer IP; both Services must name each other's namespace.
    pub const SHARING_CROSS_NAMESPACE: &str = "berth.dev/sharing-cross-namespace";
    /// On a Pod in the lab: `"false"` makes the lab kubelet's readiness probe fail.
    pub const LAB_READY: &str = "lab.berth.dev/ready";
    /// On an agent's Lease: where its membership (SWIM) socket listens, `ip:port`.
    pub const MEMBERSHIP_ENDPOINT: &str = "berth.dev/membership-endpoint";

    /// MetalLB's requested IPs (current group), read so MetalLB users can switch without edits.
    pub const METALLB_LOAD_BALANCER_IPS: &str = "metallb.io/loadBalancerIPs";
    /// MetalLB's requested IPs (legacy group).
    pub const METALLB_LEGACY_LOAD_BALANCER_IPS: &str = "metallb.universe.tf/loadBalancerIPs";
    /// MetalLB's pool name (current group).
    pub const METALLB_ADDRESS_POOL: &str = "metallb.io/address-pool";
    /// MetalLB's pool name (legacy group).
    pub const METALLB_LEGACY_ADDRESS_POOL: &str = "metallb.universe.tf/address-pool";
    /// MetalLB's sharing key (current group).
    pub const METALLB_ALLOW_SHARED_IP: &str = "metallb.io/allow-shared-ip";
    /// MetalLB's sharing key (legacy group).
    pub const METALLB_LEGACY_ALLOW_SHARED_IP: &str = "metallb.universe.tf/allow-shared-ip";

    /// Requested IPs, in order of precedence: berth's own key wins over MetalLB's.
    pub const LOAD_BALANCER_IPS_PRECEDENCE: [&str; 3] = [
        LOAD_BALANCER_IPS,
        METALLB_LOAD_BALANCER_IPS,
        METALLB_LEGACY_LOAD_BALANCER_IPS,
    ];
    /// Pool name, in order of precedence.
    pub const IP_POOL_PRECEDENCE: [&str; 3] =
        [IP_POOL, METALLB_ADDRESS_POOL, METALLB_LEGACY_ADDRESS_POOL];
    /// Sharing key, in order of precedence.
    pub const SHARING_KEY_PRECEDENCE: [&str; 3] = [
        SHARING_KEY,
        METALLB_ALLOW_SHARED_IP,
        METALLB_LEGACY_ALLOW_SHARED_IP,
    ];

    /// Set on Endpoints truncated to 1000 addresses.
    pub const ENDPOINTS_OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
    /// Value of [`ENDPOINTS_OVER_CAPACITY`].
    pub const ENDPOINTS_OVER_CAPACITY_TRUNCATED: &str = "truncated";
    /// Time of the pod change that triggered an Endpoints/EndpointSlice update.
    pub const ENDPOINTS_LAST_CHANGE_TRIGGER_TIME: &str =
        "endpoints.kubernetes.io/last-change-trigger-time";

    /// AWS: `internal` (default) or `internet-facing`.
    pub const AWS_LOAD_BALANCER_SCHEME: &str =
        "service.beta.kubernetes.io/aws-load-balancer-scheme";
    /// AWS: comma-separated subnet IDs or names.
    pub const AWS_LOAD_BALANCER_SUBNETS: &str =
        "service.beta.kubernetes.io/aws-load-balancer-subnets";
    /// AWS health check: `TCP`, `HTTP` or `HTTPS`.
    pub const AWS_HEALTHCHECK_PROTOCOL: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol";
    /// AWS health check: port number or `traffic-port`.
    pub const AWS_HEALTHCHECK_PORT: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port";
    /// AWS health check: HTTP path.
    pub const AWS_HEALTHCHECK_PATH: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path";
    /// AWS health check: seconds between checks.
    pub const AWS_HEALTHCHECK_INTERVAL: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
    /// AWS health check: seconds before a check times out.
    pub const AWS_HEALTHCHECK_TIMEOUT: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout";
    /// AWS health check: consecutive successes before a target is healthy.
    pub const AWS_HEALTHCHECK_HEALTHY_THRESHOLD: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold";
    /// AWS health check: consecutive failures before a target is unhealthy.
    pub const AWS_HEALTHCHECK_UNHEALTHY_THRESHOLD: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-unhealthy-threshold";
    /// AWS health check: HTTP codes counted as healthy, e.g. `200-399`.
    pub const AWS_HEALTHCHECK_SUCCESS_CODES: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-success-codes";
    /// AWS NLB target type: `instance` (node ports, default) or `ip` (pod IPs).
    pub const AWS_NLB_TARGET_TYPE: &str =
        "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type";
    /// AWS: the NLB's name (at most 32 characters) instead of the derived one.
    pub const AWS_LOAD_BALANCER_NAME: &str = "service.beta.kubernetes.io/aws-load-balancer-name";
    /// AWS: `k1=v1,k2=v2` tags added to every resource made for the Service.
    pub const AWS_ADDITIONAL_RESOURCE_TAGS: &str =
        "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
    /// AWS: `k1=v1,...` NLB attributes; only the keys listed are managed.
    pub const AWS_LOAD_BALANCER_ATTRIBUTES: &str =
        "service.beta.kubernetes.io/aws-load-balancer-attributes";
    /// AWS: `k1=v1,...` attributes of every target group; only the keys listed are managed.
    pub const AWS_TARGET_GROUP_ATTRIBUTES: &str =
        "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
    /// AWS: the ACM certificate ARN of TLS listeners.
    pub const AWS_SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
    /// AWS: the ports (numbers or names) that get TLS listeners; all of them when absent.
    pub const AWS_SSL_PORTS: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-ports";
    /// AWS: the TLS listeners' security policy.
    pub const AWS_SSL_NEGOTIATION_POLICY: &str =
        "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy";
    /// AWS: `*` turns proxy protocol v2 on for every target group.
    pub const AWS_PROXY_PROTOCOL: &str =
        "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
    /// AWS: `k1=v1,...` node labels: only nodes carrying all of them are instance targets.
    pub const AWS_TARGET_NODE_LABELS: &str =
        "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
    /// The ARN of the NLB berth made for the Service, so a resync reads it directly instead
    /// of searching the account.
    pub const AWS_LOAD_BALANCER_ARN: &str = "berth.dev/aws-load-balancer-arn";
}

/// Labels berth reads or writes.
pub mod label {
    /// Marks EndpointSlices by their controller.
    pub const ENDPOINTSLICE_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
    /// Value of [`ENDPOINTSLICE_MANAGED_BY`] on slices Kubernetes' own controller writes.
    pub const ENDPOINTSLICE_MANAGED_BY_KUBERNETES: &str = "endpointslice-controller.k8s.io";
    /// Value of [`ENDPOINTSLICE_MANAGED_BY`] on slices berth owns. A label value may not hold a
    /// `/`, so this follows upstream's `endpointslice-controller.k8s.io`.
    pub const ENDPOINTSLICE_MANAGED_BY_BERTH: &str = "endpointslice-controller.berth.dev";
    /// The Service an EndpointSlice belongs to.
    pub const ENDPOINTSLICE_SERVICE_NAME: &str = "kubernetes.io/service-name";
    /// Names the proxy that programs a Service; kube-proxy skips Services that carry it.
    pub const SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
    /// Value of [`SERVICE_PROXY_NAME`] that selects berth's agent.
    pub const SERVICE_PROXY_NAME_BERTH: &str = "berth";
    /// Services with this label get no datapath.
    pub const HEADLESS: &str = "service.kubernetes.io/headless";
    /// Nodes with this label are never load balancer targets or announcers.
    pub const EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: &str =
        "node.kubernetes.io/exclude-from-external-load-balancers";
    /// Zone of a node, copied into EndpointSlices.
    pub const TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
    /// Hostname of a node.
    pub const HOSTNAME: &str = "kubernetes.io/hostname";
    /// On a ServiceL2Status: the namespace of the Service it describes
    /// (`kubectl get l2status -l berth.dev/service-name=web`).
    pub const SERVICE_NAMESPACE: &str = "berth.dev/service-namespace";
    /// On a ServiceL2Status: the name of the Service it describes.
    pub const SERVICE_NAME: &str = "berth.dev/service-name";
    /// On a BGPSessionState: the BGPPeer it describes (`kubectl get bgpsession -l berth.dev/bgp-peer=tor`).
    pub const BGP_PEER: &str = "berth.dev/bgp-peer";
    /// On a BGPSessionState: the node whose session it describes.
    pub const NODE: &str = "berth.dev/node";
}

/// Node taints berth reads.
pub mod taint {
    /// The cluster autoscaler is about to delete the Node: the agent's `/healthz` fails so load
    /// balancers drain it first (KEP-3836).
    pub const TO_BE_DELETED_BY_CLUSTER_AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";
}

/// Finalizers berth puts on objects.
pub mod finalizer {
    /// Holds a Service until its cloud load balancer is deleted.
    pub const LOAD_BALANCER: &str = "berth.dev/load-balancer";
    /// Upstream's service-controller finalizer, on every LoadBalancer Service berth serves:
    /// the Service stays until its load balancer is gone (an `l2` address released and its
    /// status cleared, an `aws-nlb` load balancer deleted).
    pub const LOAD_BALANCER_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";
}

/// Server-side apply field managers, one per writer, so ownership of each field is visible.
pub mod field_manager {
    /// The controller (allocation, status, endpoints, cloud load balancers).
    pub const CONTROLLER: &str = "berth-controller";
    /// The node agent (its ServiceL2Status records, its Lease).
    pub const AGENT: &str = "berth-agent";
}

/// Leases for leader election and agent liveness.
pub mod lease {
    /// The controller replicas' leader-election Lease.
    pub const CONTROLLER: &str = "berth-controller";
    /// Prefix of each agent's liveness Lease; the node name follows.
    pub const AGENT_PREFIX: &str = "berth-agent-";

    /// The longest object name (a DNS subdomain).
    pub const MAX_NAME: usize = 253;

    /// Name of the liveness Lease of the agent on `node`: the prefix and the node name, or for
    /// a node name too long for that (over 241 characters), the prefix, the name's first 224
    /// characters, `-` and 16 hex digits of a hash of the whole name. Either way the Lease's
    /// `holderIdentity` names the node in full.
    pub fn agent_lease_name(node: &str) -> String {
        if AGENT_PREFIX.len() + node.len() <= MAX_NAME {
            return format!("{AGENT_PREFIX}{node}");
        }
        let keep = MAX_NAME - AGENT_PREFIX.len() - 17;
        let head: String = node.chars().take(keep).collect();
        format!(
            "{AGENT_PREFIX}{}-{:016x}",
            head.trim_end_matches(['-', '.']),
            fnv1a(node)
        )
    }

    /// Node name of an agent liveness Lease read from its name alone, or `None` for any other
    /// Lease. A hashed name reads back as its shortened form: read it through its
    /// `holderIdentity` with [`agent_lease_node`].
    pub fn node_of_agent_lease(lease: &str) -> Option<&str> {
        lease
            .strip_prefix(AGENT_PREFIX)
            .filter(|node| !node.is_empty() && agent_lease_name(node) == lease)
    }

    /// The node of an agent Lease named `lease` held by `holder`: the holder when the name is
    /// the holder's, else the node named in full in the Lease name; `None` for other Leases.
    pub fn agent_lease_node<'a>(lease: &'a str, holder: Option<&'a str>) -> Option<&'a str> {
        match holder {
            Some(holder) if !holder.is_empty() && agent_lease_name(holder) == lease => Some(holder),
            _ => node_of_agent_lease(lease),
        }
    }

    /// 64-bit FNV-1a: stable across versions and platforms, enough to tell long names apart.
    fn fnv1a(text: &str) -> u64 {
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }
}

/// Condition types and reasons on Services and IPPools.
pub mod condition {
    /// Service: whether the LoadBalancer IP (and node ports) could be allocated.
    pub const ALLOCATED: &str = "berth.dev/Allocated";
    /// Service: whether the load balancer is provisioned and its ingress published.
    pub const LOAD_BALANCER_READY: &str = "berth.dev/LoadBalancerReady";
    /// Service: whether the agents program it as written. `False` (`ServiceTooLarge`): past a
    /// size bound, no node programs it; `True` with `EntriesDropped`: some entries are left out
    /// and the rest is programmed. Written only once something was ever wrong.
    pub const DATAPATH_ACCEPTED: &str = "berth.dev/DatapathAccepted";
    /// IPPool: whether the pool's addresses overlap another pool's.
    pub const OVERLAPPING: &str = "Overlapping";
    /// IPPool: whether the pool's addresses contain the cluster's own (Node addresses, the
    /// service CIDR, pod CIDRs, reserved addresses), which are cut out of it.
    pub const OVERLAPS_CLUSTER: &str = "OverlapsCluster";
    /// IPPool: whether the pool's spec is valid (the controller re-validates what the apiserver accepted).
    pub const VALID: &str = "Valid";
    /// BGPSessionState: whether the node's BGP session with the peer is up.
    pub const ESTABLISHED: &str = "Established";

    /// `status` values of a condition.
    pub const TRUE: &str = "True";
    pub const FALSE: &str = "False";

    /// Reasons, CamelCase as Kubernetes expects.
    pub mod reason {
        pub const ALLOCATED: &str = "Allocated";
        /// `DatapathAccepted`: programmed as written.
        pub const ACCEPTED: &str = "Accepted";
        /// `DatapathAccepted`: past `--max-service-*`, not programmed.
        pub const SERVICE_TOO_LARGE: &str = "ServiceTooLarge";
        /// `DatapathAccepted`: some `externalIPs` / `loadBalancerSourceRanges` entries left out.
        pub const ENTRIES_DROPPED: &str = "EntriesDropped";
        pub const IP_ALREADY_ALLOCATED: &str = "IPAlreadyAllocated";
        pub const PORT_ALREADY_ALLOCATED: &str = "PortAlreadyAllocated";
        pub const NOT_IN_ANY_POOL: &str = "NotInAnyPool";
        pub const POOL_NOT_FOUND: &str = "PoolNotFound";
        /// The Service keeps an address that no IPPool contains any more.
        pub const POOL_GONE: &str = "PoolGone";
        pub const POOL_NOT_ADMITTING: &str = "PoolNotAdmitting";
        pub const NO_AVAILABLE_POOL: &str = "NoAvailablePool";
        pub const RANGE_FULL: &str = "RangeFull";
        pub const INVALID_REQUEST: &str = "InvalidRequest";
        pub const SHARING_CONFLICT: &str = "SharingConflict";
        pub const OVERLAPS_POOL: &str = "OverlapsPool";
        pub const NO_OVERLAP: &str = "NoOverlap";
        pub const CLUSTER_ADDRESSES: &str = "ClusterAddresses";
        pub const NO_CLUSTER_ADDRESSES: &str = "NoClusterAddresses";
        pub const INVALID_SPEC: &str = "InvalidSpec";
        pub const VALID_SPEC: &str = "ValidSpec";
        pub const PROVISIONED: &str = "Provisioned";
        pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
        /// The load balancer would exceed an AWS quota; nothing was made.
        pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
        /// The Service's annotations or ports cannot be modelled.
        pub const INVALID_CONFIGURATION: &str = "InvalidConfiguration";
        /// BGPSessionState: the session is up.
        pub const ESTABLISHED: &str = "Established";
        /// BGPSessionState: the peer is not in this node's FRR configuration (a missing
        /// BFDProfile or password Secret, a second AS, ...); the message says why.
        pub const NOT_CONFIGURED: &str = "NotConfigured";
        /// BGPSessionState: the router's OPEN carried another AS than the BGPPeer's peerASN, or
        /// the router refused this node's AS.
        pub const BAD_PEER_AS: &str = "BadPeerAS";
        /// BGPSessionState: TCP MD5 signatures do not match (a wrong or missing password).
        pub const AUTHENTICATION_FAILURE: &str = "AuthenticationFailure";
        /// BGPSessionState: the router sent another NOTIFICATION; the message carries it.
        pub const NOTIFICATION: &str = "Notification";
        /// BGPSessionState: the session is being set up (Idle, Connect, Active, OpenSent,
        /// OpenConfirm) with no error seen.
        pub const CONNECTING: &str = "Connecting";
        /// BGPSessionState: FRR did not answer the agent.
        pub const FRR_UNAVAILABLE: &str = "FRRUnavailable";
    }
}

/// Event reasons, in the cloud-controller-manager's vocabulary where one exists.
pub mod event {
    pub const ENSURING_LOAD_BALANCER: &str = "EnsuringLoadBalancer";
    pub const ENSURED_LOAD_BALANCER: &str = "EnsuredLoadBalancer";
    pub const SYNC_LOAD_BALANCER_FAILED: &str = "SyncLoadBalancerFailed";
    pub const DELETING_LOAD_BALANCER: &str = "DeletingLoadBalancer";
    pub const DELETED_LOAD_BALANCER: &str = "DeletedLoadBalancer";
    pub const ALLOCATION_FAILED: &str = "AllocationFailed";
    /// Warning: the Service keeps an address that no IPPool contains any more.
    pub const POOL_GONE: &str = "PoolGone";
    pub const IP_ALLOCATED: &str = "IPAllocated";
    /// Warning on an IPPool: some of its addresses are the cluster's own and never assigned.
    pub const POOL_OVERLAPS_CLUSTER: &str = "PoolOverlapsCluster";
    pub const ANNOUNCING: &str = "Announcing";
    /// Warning on a Service: another host announces its L2 address.
    pub const ADDRESS_CONFLICT: &str = "AddressConflict";
    /// Warning: the Service is past a size bound and no node programs it.
    pub const SERVICE_TOO_LARGE: &str = "ServiceTooLarge";
    /// Warning: entries of the Service are left out of every node's datapath.
    pub const ENTRIES_DROPPED: &str = "EntriesDropped";
    /// The AWS provider chose subnets by their tags.
    pub const SUBNETS_DISCOVERED: &str = "SubnetsDiscovered";
    /// Component name reported on Events.
    pub const CONTROLLER_COMPONENT: &str = "berth-controller";
    pub const AGENT_COMPONENT: &str = "berth-agent";
}

/// Tags on AWS resources berth owns: ownership is read from these, never from names.
pub mod aws_tag {
    /// Cluster name; resources without it are never touched.
    pub const CLUSTER: &str = "berth.dev/cluster";
    /// `<namespace>/<name>` of the owning Service.
    pub const SERVICE: &str = "berth.dev/service";
    /// Which part of the Service's stack: `LoadBalancer`, or `<port>/<protocol>` for a target group.
    pub const RESOURCE: &str = "berth.dev/resource";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_berth_writes_is_a_valid_label() {
        use berth_core::{label_key_problem, label_value_problem};
        let key = label::ENDPOINTSLICE_MANAGED_BY;
        assert_eq!(label_key_problem(key), None, "{key}");
        let value = label::ENDPOINTSLICE_MANAGED_BY_BERTH;
        assert_eq!(label_value_problem(value), None, "{value}");
    }

    #[test]
    fn api_version_is_group_slash_version() {
        assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
    }

    #[test]
    fn agent_lease_name_round_trips() {
        let name = lease::agent_lease_name("node-1");
        assert_eq!(name, "berth-agent-node-1");
        assert_eq!(lease::node_of_agent_lease(&name), Some("node-1"));
    }

    #[test]
    fn long_node_names_get_a_hashed_lease_name_that_still_finds_the_node() {
        let longest_plain = "n".repeat(241);
        assert_eq!(
            lease::agent_lease_name(&longest_plain),
            format!("berth-agent-{longest_plain}")
        );
        let long = format!("{}.example.com", "a".repeat(239));
        let other = format!("{}.example.org", "a".repeat(239));
        let name = lease::agent_lease_name(&long);
        assert_eq!(name.len(), lease::MAX_NAME);
        assert!(
            berth_core::dns1123_subdomain_problem(&name).is_none(),
            "{name}"
        );
        assert_ne!(name, lease::agent_lease_name(&other));
        assert_eq!(name, lease::agent_lease_name(&long));
        // The node is read through the holder; a holder whose name it is not is ignored.
        assert_eq!(
            lease::agent_lease_node(&name, Some(&long)),
            Some(long.as_str())
        );
        assert_ne!(
            lease::agent_lease_node(&name, Some(&other)),
            Some(other.as_str())
        );
        assert_eq!(
            lease::agent_lease_node("berth-agent-node-1", Some("node-1")),
            Some("node-1")
        );
        assert_eq!(
            lease::agent_lease_node("berth-agent-node-1", None),
            Some("node-1")
        );
        // A holder that does not match the name does not rename the Lease's node.
        assert_eq!(
            lease::agent_lease_node("berth-agent-node-1", Some("node-2")),
            Some("node-1")
        );
    }

    #[test]
    fn only_agent_leases_have_a_node() {
        assert_eq!(lease::node_of_agent_lease(lease::CONTROLLER), None);
        assert_eq!(lease::node_of_agent_lease("berth-agent-"), None);
        assert_eq!(lease::node_of_agent_lease("kube-scheduler"), None);
    }

    #[test]
    fn precedence_lists_put_berth_first() {
        for list in [
            annotation::LOAD_BALANCER_IPS_PRECEDENCE,
            annotation::IP_POOL_PRECEDENCE,
            annotation::SHARING_KEY_PRECEDENCE,
        ] {
            assert!(list[0].starts_with("berth.dev/"), "{list:?}");
            assert!(list[1].starts_with("metallb.io/"), "{list:?}");
            assert!(list[2].starts_with("metallb.universe.tf/"), "{list:?}");
        }
    }

    #[test]
    fn served_class_follows_the_explicit_class_then_the_default() {
        use class::*;
        assert_eq!(served_class(Some(L2), None), Some(L2));
        assert_eq!(served_class(Some(AWS_NLB), Some(L2)), Some(AWS_NLB));
        assert_eq!(served_class(None, Some(L2)), Some(L2));
        assert_eq!(served_class(None, None), None);
        // Another controller's class is never taken over, whatever the default.
        assert_eq!(served_class(Some("metallb.io/metallb"), Some(L2)), None);
        assert_eq!(served_class(None, Some("bogus")), None);
    }

    #[test]
    fn classes_are_in_the_berth_group() {
        for class in class::ALL {
            assert!(class.starts_with("berth.dev/"));
        }
    }
}
