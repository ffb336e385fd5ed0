//! One Service watch for both controllers. The allocation worker watches Services anyway; when
//! the endpoints controller runs beside it, the worker passes every watch event on with the very
//! objects it keeps, so Services are decoded and held once instead of twice (they were the
//! largest part of the controller's memory after the pods).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;

/// A Service watch event with shared objects.
pub(crate) type ServiceEvent = Event<Arc<Service>>;
pub(crate) type ServiceFeedSender = mpsc::UnboundedSender<ServiceEvent>;
pub(crate) type ServiceFeed = mpsc::UnboundedReceiver<ServiceEvent>;

/// A feed from the worker to the endpoints controller of one leadership term. Unbounded: an
/// event holds only shared pointers, and a slow reader must not hold up allocation.
pub(crate) fn service_feed() -> (ServiceFeedSender, ServiceFeed) {
    mpsc::unbounded_channel()
}

/// The same watch event with `f` applied to its objects.
pub(crate) fn map_event<A, B>(event: Event<A>, mut f: impl FnMut(A) -> B) -> Event<B> {
    match event {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_event_keeps_the_kind_of_event() {
        let mapped: Vec<Event<usize>> = [
            Event::Init,
            Event::InitApply("ab"),
            Event::InitDone,
            Event::Apply("abc"),
            Event::Delete("a"),
        ]
        .into_iter()
        .map(|e| map_event(e, str::len))
        .collect();
        assert!(matches!(
            mapped.as_slice(),
            [
                Event::Init,
                Event::InitApply(2),
                Event::InitDone,
                Event::Apply(3),
                Event::Delete(1)
            ]
        ));
    }
}
