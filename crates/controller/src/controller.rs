//! `berth controller`'s allocation and load-balancer controller: leader election around the
//! single-writer loop, and readiness.

use std::sync::Arc;

use berth_telemetry::ReadinessCheck;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::allocation::apply::WriteCtx;
use crate::allocation::Worker;
use crate::config::ControllerConfig;
use crate::datapath_report::DatapathReport;
use crate::endpoints::EndpointsController;
use crate::events::{event_queue, EVENT_QUEUE, EVENT_WRITERS};
use crate::lease::{LeaderElector, Term};
use crate::load_balancer::{AwsRunner, L2Provider, Provider};
use crate::metrics::Metrics;
use crate::service_feed::service_feed;
use crate::Error;

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Allocation (ClusterIPs, NodePorts, LoadBalancer IPs), IPPool status and the `l2`
/// load balancer.
pub struct AllocationController {
    client: Client,
    cfg: ControllerConfig,
    metrics: Metrics,
    provider: Arc<dyn Provider>,
    readiness: Option<Arc<ReadinessCheck>>,
    /// Runs beside the allocation worker in every leadership term, when configured.
    endpoints: Option<EndpointsController>,
    /// The `aws-nlb` class's controller, run beside the allocation worker in every term.
    aws: Option<AwsRunner>,
    /// Until when leading is certain (what the AWS client is fenced by).
    term: Term,
}

impl AllocationController {
    /// Builds; nothing runs until [`Self::run`].
    pub fn new(client: Client, cfg: ControllerConfig, registry: &mut Registry) -> Self {
        let endpoints = cfg.endpoints.clone().map(|config| {
            EndpointsController::new(
                client.clone(),
                config,
                registry.sub_registry_with_prefix("endpoints"),
            )
        });
        Self {
            client,
            cfg,
            endpoints,
            metrics: Metrics::new(registry),
            provider: Arc::new(L2Provider),
            readiness: None,
            aws: None,
            term: Term::default(),
        }
    }

    /// Until when this replica's leadership is certain: fences work that must stop before a
    /// successor starts (calls to AWS).
    pub fn term(&self) -> Term {
        self.term.clone()
    }

    /// Serves the `aws-nlb` class with this runner (see `load_balancer::aws`).
    pub fn with_aws(mut self, runner: AwsRunner) -> Self {
        self.aws = Some(runner);
        self
    }

    /// Ready once existing allocations are adopted while leading, or while standing by.
    pub fn with_readiness(mut self, check: ReadinessCheck) -> Self {
        self.readiness = Some(Arc::new(check));
        self
    }

    /// Replaces the `l2` provider (tests inject failing ones).
    pub fn with_provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.provider = provider;
        self
    }

    /// Runs until `shutdown`; with leader election, only while leading, starting afresh
    /// (list, adopt, assign) each time leadership is gained.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Some(lease_cfg) = self.cfg.lease.clone() else {
            self.term.extend_unbounded();
            let (_tx, rx) = watch::channel(true);
            self.metrics.leader.set(1);
            self.lead(rx, shutdown).await?;
            return Ok(());
        };
        let elector =
            LeaderElector::new(self.client.clone(), lease_cfg).with_term(self.term.clone());
        let (tx, rx) = watch::channel(false);
        let election_stop = CancellationToken::new();
        // A task of its own, so that a busy allocation loop cannot delay the renewals past
        // the renew deadline (polled from this future, it could, and the replica stepped
        // down again and again under load); aborted with this future, so that if the
        // controller dies, so does its claim on the Lease.
        let mut election = AbortOnDrop(tokio::spawn(elector.run(tx, election_stop.clone())));
        let result = self.terms(rx, &shutdown).await;
        election_stop.cancel();
        // Waits for the Lease to be handed back.
        if let Err(e) = (&mut election.0).await {
            tracing::warn!(error = %e, "leader election task ended abnormally");
        }
        result
    }

    /// Leads whenever elected, starting afresh each term, until shutdown.
    async fn terms(
        &self,
        mut rx: watch::Receiver<bool>,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        loop {
            self.metrics.leader.set(0);
            if let Some(r) = &self.readiness {
                r.set_ready(true);
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                changed = rx.wait_for(|leading| *leading) => if changed.is_err() { return Ok(()) },
            }
            self.metrics.leader.set(1);
            if let Some(r) = &self.readiness {
                r.set_ready(false);
            }
            let term = shutdown.child_token();
            let mut watch_rx = rx.clone();
            let lost = async move {
                let _ = watch_rx.wait_for(|leading| !*leading).await;
            };
            let lead = self.lead(rx.clone(), term.clone());
            tokio::pin!(lead);
            tokio::select! {
                r = &mut lead => r?,
                _ = lost => {
                    tracing::warn!("leadership lost; standing by");
                    term.cancel();
                    // The writes already sent finish before the next term lists.
                    if let Err(e) = lead.await {
                        tracing::warn!(error = %e, "term ended with an error after leadership was lost");
                    }
                }
            }
            term.cancel();
        }
    }

    async fn lead(
        &self,
        leading: watch::Receiver<bool>,
        token: CancellationToken,
    ) -> Result<(), Error> {
        let (events, event_writer) = event_queue(
            self.client.clone(),
            self.cfg.instance.clone(),
            self.metrics.clone(),
            leading.clone(),
            EVENT_QUEUE,
            EVENT_WRITERS,
        );
        let ctx_events = events.clone();
        let ctx = Arc::new(WriteCtx {
            client: self.client.clone(),
            events,
            provider: self.provider.clone(),
            metrics: self.metrics.clone(),
            leading,
        });
        let report_ctx = ctx.clone();
        let readiness = self.readiness.clone();
        let mut worker = Worker::new(
            self.cfg.clone(),
            self.metrics.clone(),
            self.client.clone(),
            ctx,
            Box::new(move || {
                if let Some(r) = &readiness {
                    r.set_ready(true);
                }
            }),
        )?;
        let (report_feed, report_services) = service_feed();
        worker.feed_services(report_feed);
        let report = DatapathReport::new(self.cfg.service_policy.clone()).run(
            report_ctx,
            report_services,
            token.clone(),
        );
        let endpoints = self.endpoints.clone().map(|endpoints| {
            let (feed, services) = service_feed();
            worker.feed_services(feed);
            (endpoints, services)
        });
        let aws = self
            .aws
            .as_ref()
            .map(|run| run(self.client.clone(), ctx_events.clone(), token.clone()));
        // Events end with the term: queued ones are not the next leader's to send.
        let worker = async {
            let aws = async {
                if let Some(aws) = aws {
                    aws.await;
                }
            };
            tokio::join!(
                worker.run(token.clone()),
                event_writer.run(token.clone()),
                aws,
                report
            );
        };
        let Some((endpoints, services)) = endpoints else {
            worker.await;
            return Ok(());
        };
        // A failed endpoints controller ends the term, so the replica stops rather than leading
        // with half its job undone.
        let endpoints = async {
            let result = endpoints
                .run_with_service_feed(token.clone(), services)
                .await;
            token.cancel();
            result
        };
        let ((), result) = tokio::join!(worker, endpoints);
        result
    }
}
