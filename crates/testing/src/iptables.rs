//! Wrappers around an [`Iptables`] that let a test step into `iptables-restore`: fail it on
//! demand, or time it. Everything but the restore passes straight through.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_datapath::iptables::Iptables;
use berth_datapath::{ChainName, Error, JumpRule, Payload, Table};

/// What happens around one restore: `restore` decides whether and how `inner` is called.
pub trait RestoreHook<I: Iptables> {
    fn restore(&mut self, inner: &mut I, payload: &dyn Payload) -> Result<(), Error>;
}

/// `inner` with `hook` around its restores.
#[derive(Clone)]
pub struct Hooked<I, H> {
    pub inner: I,
    pub hook: H,
}

impl<I, H> Hooked<I, H> {
    pub fn new(inner: I, hook: H) -> Self {
        Hooked { inner, hook }
    }
}

impl<I: Iptables, H: RestoreHook<I>> Iptables for Hooked<I, H> {
    fn restore(&mut self, payload: &dyn Payload) -> Result<(), Error> {
        self.hook.restore(&mut self.inner, payload)
    }

    fn save(&mut self, table: Table) -> Result<String, Error> {
        self.inner.save(table)
    }

    fn ensure_chain(&mut self, table: Table, chain: &ChainName) -> Result<(), Error> {
        self.inner.ensure_chain(table, chain)
    }

    fn chain_exists(&mut self, table: Table, chain: &ChainName) -> Result<bool, Error> {
        self.inner.chain_exists(table, chain)
    }

    fn ensure_jump(&mut self, jump: &JumpRule) -> Result<(), Error> {
        self.inner.ensure_jump(jump)
    }
}

/// Restores fail while the switch is on; clones share one switch.
#[derive(Clone, Default)]
pub struct FailSwitch(pub Arc<AtomicBool>);

impl FailSwitch {
    pub fn set(&self, fail: bool) {
        self.0.store(fail, Ordering::SeqCst);
    }
}

impl<I: Iptables> RestoreHook<I> for FailSwitch {
    fn restore(&mut self, inner: &mut I, payload: &dyn Payload) -> Result<(), Error> {
        if self.0.load(Ordering::SeqCst) {
            return Err(Error::Restore {
                reason: "injected failure".into(),
            });
        }
        inner.restore(payload)
    }
}

/// Adds up the wall time of `iptables-restore` alone.
#[derive(Clone, Copy, Default)]
pub struct RestoreTimer {
    pub total: Duration,
}

impl<I: Iptables> RestoreHook<I> for RestoreTimer {
    fn restore(&mut self, inner: &mut I, payload: &dyn Payload) -> Result<(), Error> {
        let start = Instant::now();
        let result = inner.restore(payload);
        self.total += start.elapsed();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_datapath::fake::MemoryIptables;

    #[test]
    fn the_switch_fails_restores_and_lets_them_through_again() {
        let payload = "*filter\n:BERTH-TEST - [0:0]\nCOMMIT\n";
        let fail = FailSwitch::default();
        let mut iptables = Hooked::new(MemoryIptables::default(), fail.clone());
        fail.set(true);
        assert!(matches!(
            iptables.restore(&payload),
            Err(Error::Restore { .. })
        ));
        fail.set(false);
        assert!(iptables.restore(&payload).is_ok());
        assert!(iptables
            .save(Table::Filter)
            .is_ok_and(|dump| dump.contains("BERTH-TEST")));
    }
}
