//! The ELBv2 client fenced by the leadership term: no call starts once the term's deadline
//! has passed, and a call under way is dropped (its connection closed, no retry sent) when
//! it passes. A deposed leader, partitioned from the API server or paused and woken, thus
//! stops calling AWS before a successor may start: the deadline is the last renewal plus the
//! renew deadline, and a standby takes over only after the lease duration, which is longer.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use berth_aws::elbv2::{ApiError, ApiErrorKind, ApiResult, Elbv2, LbQuery, Page, TgQuery};
use berth_aws::model::{
    HealthCheck, ListenerSpec, ListenerTls, LoadBalancerSpec, Target, TargetGroupSpec, TgProtocol,
};
use berth_aws::observed::{Listener, LoadBalancer, Tags, TargetGroup};

use tokio::time::Instant;

use crate::lease::Term;

/// The error code of a call refused or cut off because the term ended.
pub const TERM_ENDED: &str = "LeadershipTermEnded";

/// Any ELBv2 client, called only while `term` is certain.
#[derive(Debug)]
pub struct Fenced<C> {
    inner: C,
    term: Term,
}

impl<C> Fenced<C> {
    pub fn new(inner: C, term: Term) -> Self {
        Fenced { inner, term }
    }

    pub fn inner(&self) -> &C {
        &self.inner
    }
}

fn ended(operation: &'static str) -> ApiError {
    ApiError::new(
        operation,
        ApiErrorKind::Transient,
        TERM_ENDED,
        "this replica's leadership term ended: no more AWS calls until it leads again",
    )
}

impl<C> Fenced<C> {
    async fn fenced<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = ApiResult<T>>,
    ) -> ApiResult<T> {
        let Some(mut deadline) = self.term.valid_until(Instant::now()) else {
            tracing::debug!(operation, "AWS call refused: the leadership term ended");
            return Err(ended(operation));
        };
        tokio::pin!(call);
        loop {
            match tokio::time::timeout_at(deadline, &mut call).await {
                Ok(result) => return result,
                // Renewed meanwhile: the call may go on until the new deadline.
                Err(_) => match self.term.valid_until(Instant::now()) {
                    Some(later) if later > deadline => deadline = later,
                    _ => {
                        tracing::warn!(operation, "AWS call cut off: the leadership term ended");
                        return Err(ended(operation));
                    }
                },
            }
        }
    }
}

impl<C: Elbv2> Elbv2 for Fenced<C> {
    async fn describe_load_balancers(&self, query: LbQuery) -> ApiResult<Page<LoadBalancer>> {
        let call = self.inner.describe_load_balancers(query);
        self.fenced("DescribeLoadBalancers", call).await
    }

    async fn describe_target_groups(&self, query: TgQuery) -> ApiResult<Page<TargetGroup>> {
        let call = self.inner.describe_target_groups(query);
        self.fenced("DescribeTargetGroups", call).await
    }

    async fn describe_tags(&self, arns: Vec<String>) -> ApiResult<BTreeMap<String, Tags>> {
        let call = self.inner.describe_tags(arns);
        self.fenced("DescribeTags", call).await
    }

    async fn describe_listeners(&self, load_balancer_arn: String) -> ApiResult<Vec<Listener>> {
        let call = self.inner.describe_listeners(load_balancer_arn);
        self.fenced("DescribeListeners", call).await
    }

    async fn describe_target_health(
        &self,
        target_group_arn: String,
    ) -> ApiResult<BTreeSet<Target>> {
        let call = self.inner.describe_target_health(target_group_arn);
        self.fenced("DescribeTargetHealth", call).await
    }

    async fn describe_load_balancer_attributes(
        &self,
        arn: String,
    ) -> ApiResult<BTreeMap<String, String>> {
        let call = self.inner.describe_load_balancer_attributes(arn);
        self.fenced("DescribeLoadBalancerAttributes", call).await
    }

    async fn describe_target_group_attributes(
        &self,
        arn: String,
    ) -> ApiResult<BTreeMap<String, String>> {
        let call = self.inner.describe_target_group_attributes(arn);
        self.fenced("DescribeTargetGroupAttributes", call).await
    }

    async fn create_load_balancer(&self, spec: LoadBalancerSpec) -> ApiResult<LoadBalancer> {
        let call = self.inner.create_load_balancer(spec);
        self.fenced("CreateLoadBalancer", call).await
    }

    async fn create_target_group(
        &self,
        spec: TargetGroupSpec,
        vpc_id: Option<String>,
    ) -> ApiResult<TargetGroup> {
        let call = self.inner.create_target_group(spec, vpc_id);
        self.fenced("CreateTargetGroup", call).await
    }

    async fn create_listener(
        &self,
        load_balancer_arn: String,
        spec: ListenerSpec,
        target_group_arn: String,
        tags: Tags,
    ) -> ApiResult<Listener> {
        let call = self
            .inner
            .create_listener(load_balancer_arn, spec, target_group_arn, tags);
        self.fenced("CreateListener", call).await
    }

    async fn set_subnets(&self, arn: String, subnets: BTreeSet<String>) -> ApiResult<()> {
        let call = self.inner.set_subnets(arn, subnets);
        self.fenced("SetSubnets", call).await
    }

    async fn modify_load_balancer_attributes(
        &self,
        arn: String,
        attributes: BTreeMap<String, String>,
    ) -> ApiResult<()> {
        let call = self.inner.modify_load_balancer_attributes(arn, attributes);
        self.fenced("ModifyLoadBalancerAttributes", call).await
    }

    async fn modify_target_group(&self, arn: String, health_check: HealthCheck) -> ApiResult<()> {
        let call = self.inner.modify_target_group(arn, health_check);
        self.fenced("ModifyTargetGroup", call).await
    }

    async fn modify_target_group_attributes(
        &self,
        arn: String,
        attributes: BTreeMap<String, String>,
    ) -> ApiResult<()> {
        let call = self.inner.modify_target_group_attributes(arn, attributes);
        self.fenced("ModifyTargetGroupAttributes", call).await
    }

    async fn modify_listener(
        &self,
        arn: String,
        protocol: Option<TgProtocol>,
        tls: Option<ListenerTls>,
        target_group_arn: String,
    ) -> ApiResult<()> {
        let call = self
            .inner
            .modify_listener(arn, protocol, tls, target_group_arn);
        self.fenced("ModifyListener", call).await
    }

    async fn register_targets(
        &self,
        target_group_arn: String,
        targets: Vec<Target>,
    ) -> ApiResult<()> {
        let call = self.inner.register_targets(target_group_arn, targets);
        self.fenced("RegisterTargets", call).await
    }

    async fn deregister_targets(
        &self,
        target_group_arn: String,
        targets: Vec<Target>,
    ) -> ApiResult<()> {
        let call = self.inner.deregister_targets(target_group_arn, targets);
        self.fenced("DeregisterTargets", call).await
    }

    async fn delete_listener(&self, arn: String) -> ApiResult<()> {
        let call = self.inner.delete_listener(arn);
        self.fenced("DeleteListener", call).await
    }

    async fn delete_load_balancer(&self, arn: String) -> ApiResult<()> {
        let call = self.inner.delete_load_balancer(arn);
        self.fenced("DeleteLoadBalancer", call).await
    }

    async fn delete_target_group(&self, arn: String) -> ApiResult<()> {
        let call = self.inner.delete_target_group(arn);
        self.fenced("DeleteTargetGroup", call).await
    }

    async fn add_tags(&self, arn: String, tags: Tags) -> ApiResult<()> {
        let call = self.inner.add_tags(arn, tags);
        self.fenced("AddTags", call).await
    }

    async fn remove_tags(&self, arn: String, keys: Vec<String>) -> ApiResult<()> {
        let call = self.inner.remove_tags(arn, keys);
        self.fenced("RemoveTags", call).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use berth_aws::MemoryElbv2;

    use super::*;

    fn all() -> LbQuery {
        LbQuery::All { marker: None }
    }

    #[tokio::test]
    async fn calls_go_through_only_while_the_term_is_certain() {
        let term = Term::default();
        let fenced = Fenced::new(MemoryElbv2::new(), term.clone());
        // Not leading yet: refused without reaching AWS.
        let err = fenced.describe_load_balancers(all()).await.unwrap_err();
        assert_eq!(err.code, TERM_ENDED);
        assert!(fenced.inner().calls().is_empty());
        term.extend(Instant::now() + Duration::from_secs(10));
        assert!(fenced.describe_load_balancers(all()).await.is_ok());
        // A deadline in the past (a replica paused past it) refuses at once, whatever the
        // election loop has yet to notice.
        term.extend(Instant::now() - Duration::from_millis(1));
        let err = fenced.delete_load_balancer("arn".into()).await.unwrap_err();
        assert_eq!(err.code, TERM_ENDED);
        term.end();
        assert!(fenced.describe_load_balancers(all()).await.is_err());
        assert_eq!(
            fenced.inner().calls().get("DescribeLoadBalancers"),
            Some(&1)
        );
        assert_eq!(fenced.inner().calls().get("DeleteLoadBalancer"), None);
        term.extend_unbounded();
        assert!(fenced.describe_load_balancers(all()).await.is_ok());
    }

    #[tokio::test]
    async fn a_call_under_way_is_cut_off_at_the_deadline_unless_renewed() {
        let term = Term::default();
        let fenced = Fenced::new((), term.clone());
        let step = Duration::from_millis(100);
        term.extend(Instant::now() + 2 * step);
        // A call that would take a minute is dropped when the term ends.
        let slow = async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        };
        let err = fenced.fenced("RegisterTargets", slow).await.unwrap_err();
        assert_eq!(err.code, TERM_ENDED);
        // Renewed while the call runs: it finishes past the first deadline.
        term.extend(Instant::now() + 2 * step);
        let renewer = {
            let term = term.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(step).await;
                    term.extend(Instant::now() + 2 * step);
                }
            })
        };
        let long = async {
            tokio::time::sleep(5 * step).await;
            Ok(7)
        };
        assert_eq!(fenced.fenced("DescribeTags", long).await, Ok(7));
        renewer.abort();
    }
}
