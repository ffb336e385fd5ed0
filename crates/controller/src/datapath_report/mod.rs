//! What the agents do with each Service, said on the Service: agents cannot write Services, so
//! the controller runs the same pure checks they run ([`berth_api::check_service_size`],
//! [`berth_api::dropped_entries`]) over the same inputs (the Service, and its EndpointSlices'
//! sizes) and writes the `berth.dev/DatapathAccepted` condition plus a Warning Event.
//!
//! The condition is written only once something is or was wrong, so a cluster of healthy
//! Services costs no status write at all; it goes back to `True`/`Accepted` when fixed.
//! Endpoints are counted per slice port and summed over the Service's slices; the agents count
//! distinct endpoints, which differs only while one endpoint sits in two slices at once.

mod run;

use std::collections::BTreeMap;

use berth_api::names::condition as cond;
use berth_api::names::{event as ev, label};
use berth_api::{check_service_size, dropped_entries, PortSize, ServicePolicy};
use berth_core::Protocol;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub(crate) use run::DatapathReport;

/// A slice's endpoint count per port, and the Service it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceSizes {
    pub service: String,
    pub ports: Vec<(String, Protocol, usize)>,
}

/// What a slice contributes to its Service's sizes; `None` for a slice of no Service, or of
/// FQDN addresses (which no agent programs).
pub fn build_slice_sizes(slice: &EndpointSlice) -> Option<SliceSizes> {
    if slice.address_type == "FQDN" {
        return None;
    }
    let service = slice
        .metadata
        .labels
        .as_ref()?
        .get(label::ENDPOINTSLICE_SERVICE_NAME)?
        .clone();
    let count = slice
        .endpoints
        .iter()
        .filter(|e| !e.addresses.is_empty())
        .count();
    let mut ports: Vec<(String, Protocol, usize)> = Vec::new();
    for port in slice.ports.iter().flatten() {
        let Some(protocol) = Protocol::from_spec(port.protocol.as_deref()) else {
            continue;
        };
        let name = port.name.clone().unwrap_or_default();
        if !ports.iter().any(|(n, p, _)| *n == name && *p == protocol) {
            ports.push((name, protocol, count));
        }
    }
    Some(SliceSizes { service, ports })
}

/// What the agents do with a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Programmed as written.
    Accepted,
    /// Programmed without these entries (the API server's words, one per entry).
    EntriesDropped(Vec<String>),
    /// Past a bound: programmed nowhere.
    TooLarge(String),
}

/// Whether any agent programs the Service at all: not headless, not ExternalName, not claimed
/// by another proxy.
fn is_programmed(svc: &Service) -> bool {
    let Some(spec) = svc.spec.as_ref() else {
        return false;
    };
    let labels = svc.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key));
    spec.type_.as_deref() != Some("ExternalName")
        && spec.cluster_ip.as_deref() != Some("None")
        && label(label::HEADLESS).is_none()
        && label(label::SERVICE_PROXY_NAME)
            .is_none_or(|name| name == label::SERVICE_PROXY_NAME_BERTH)
}

/// The verdict on `svc` given its slices' sizes; `None` when no agent programs it.
pub fn judge<'a>(
    svc: &Service,
    slices: impl Iterator<Item = &'a SliceSizes>,
    policy: &ServicePolicy,
) -> Option<Verdict> {
    if !is_programmed(svc) {
        return None;
    }
    let spec = svc.spec.as_ref()?;
    let mut counts: BTreeMap<(&str, Protocol), usize> = BTreeMap::new();
    for slice in slices {
        for (name, protocol, count) in &slice.ports {
            let sum = counts.entry((name.as_str(), *protocol)).or_default();
            *sum = sum.saturating_add(*count);
        }
    }
    let sizes: Vec<PortSize<'_>> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let name = p.name.as_deref().unwrap_or_default();
            let protocol = Protocol::from_spec(p.protocol.as_deref()).unwrap_or(Protocol::Tcp);
            PortSize {
                name,
                protocol,
                endpoints: counts.get(&(name, protocol)).copied().unwrap_or(0),
            }
        })
        .collect();
    if let Err(too_large) = check_service_size(&policy.bounds, &sizes) {
        return Some(Verdict::TooLarge(too_large.to_string()));
    }
    let dropped = dropped_entries(spec, policy);
    Some(if dropped.is_empty() {
        Verdict::Accepted
    } else {
        Verdict::EntriesDropped(dropped.iter().map(ToString::to_string).collect())
    })
}

/// The Warning Event for a verdict: reason and note.
pub fn warning_of(verdict: &Verdict) -> Option<(&'static str, String)> {
    match verdict {
        Verdict::Accepted => None,
        Verdict::TooLarge(message) => Some((ev::SERVICE_TOO_LARGE, message.clone())),
        Verdict::EntriesDropped(entries) => Some((ev::ENTRIES_DROPPED, dropped_message(entries))),
    }
}

fn dropped_message(entries: &[String]) -> String {
    format!(
        "left out of every node's datapath, the rest of the Service is programmed: {}",
        entries.join("; ")
    )
}

/// The Service's conditions with the verdict's, and whether to record its Warning Event;
/// `None` when nothing needs writing: the condition already says it, or the Service is
/// accepted and was never reported otherwise.
pub fn plan_report(svc: &Service, verdict: &Verdict, now: Time) -> Option<(Vec<Condition>, bool)> {
    let mut conditions = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let existing = berth_api::find_condition(&conditions, cond::DATAPATH_ACCEPTED).cloned();
    if existing.is_none() && *verdict == Verdict::Accepted {
        return None;
    }
    let (status, reason, message) = match verdict {
        Verdict::Accepted => (cond::TRUE, cond::reason::ACCEPTED, String::new()),
        Verdict::EntriesDropped(entries) => (
            cond::TRUE,
            cond::reason::ENTRIES_DROPPED,
            dropped_message(entries),
        ),
        Verdict::TooLarge(message) => (
            cond::FALSE,
            cond::reason::SERVICE_TOO_LARGE,
            message.clone(),
        ),
    };
    let changed = berth_api::set_condition(
        &mut conditions,
        Condition {
            type_: cond::DATAPATH_ACCEPTED.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: svc.metadata.generation,
            last_transition_time: now,
        },
    );
    if !changed {
        return None;
    }
    // A Warning once per new finding: not again for a refresh of the same words.
    let new_finding = *verdict != Verdict::Accepted
        && existing.is_none_or(|c| {
            let written = berth_api::find_condition(&conditions, cond::DATAPATH_ACCEPTED);
            written.is_none_or(|w| w.reason != c.reason || w.message != c.message)
        });
    Some((conditions, new_finding))
}

#[cfg(test)]
mod tests;
