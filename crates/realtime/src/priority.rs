//! A dedicated thread's CPU priority. A thread of its own keeps the agent's other tasks from
//! delaying a heartbeat or an ARP answer, but not the other processes of a loaded node: with twenty runnable
//! threads on two cores, measured, the membership loop woke 80–200 ms late, all three agents at
//! once, and a node that hears nobody for the withdrawal time withdraws. So the thread asks for
//! `SCHED_RR` at the lowest real-time priority: it runs as soon as it wakes, before every
//! normal thread, and spends a few milliseconds a second. The kernel's real-time throttling
//! still leaves normal threads their share should it ever spin, and threads it starts go back to
//! the normal policy (`SCHED_RESET_ON_FORK`). Without `CAP_SYS_NICE` the call is refused and
//! the thread runs at normal priority.

use std::io;

/// The lowest real-time priority: above every normal thread, below the kernel's own.
pub const REALTIME_PRIORITY: i32 = 1;

/// Puts the calling thread under `SCHED_RR` at [`REALTIME_PRIORITY`].
pub fn raise_current_thread() -> io::Result<()> {
    sys::set_round_robin(REALTIME_PRIORITY)
}

/// Whether the calling thread runs under `SCHED_RR`.
pub fn current_thread_is_realtime() -> io::Result<bool> {
    sys::policy().map(|policy| policy == libc::SCHED_RR)
}

/// The two system calls libc offers no safe wrapper for.
#[allow(unsafe_code)]
mod sys {
    use std::io;

    pub fn set_round_robin(priority: i32) -> io::Result<()> {
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: `param` is a valid `sched_param` that outlives the call; pid 0 is the
        // calling thread.
        let rc = unsafe {
            libc::sched_setscheduler(0, libc::SCHED_RR | libc::SCHED_RESET_ON_FORK, &param)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    pub fn policy() -> io::Result<i32> {
        // SAFETY: no pointers; pid 0 is the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        if policy < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(policy & !libc::SCHED_RESET_ON_FORK)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_thread_runs_round_robin_or_is_refused_for_want_of_the_capability() {
        let outcome = std::thread::spawn(|| {
            let before = current_thread_is_realtime();
            (before, raise_current_thread(), current_thread_is_realtime())
        })
        .join();
        let Ok((before, raised, after)) = outcome else {
            panic!("the thread panicked");
        };
        assert!(matches!(before, Ok(false)), "{before:?}");
        match raised {
            Ok(()) => assert!(matches!(after, Ok(true)), "{after:?}"),
            Err(err) => {
                assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
                assert!(matches!(after, Ok(false)), "{after:?}");
            }
        }
    }

    #[test]
    fn threads_a_raised_thread_starts_run_at_normal_priority() {
        let outcome = std::thread::spawn(|| {
            let raised = raise_current_thread();
            let child = std::thread::spawn(current_thread_is_realtime).join();
            (raised, child)
        })
        .join();
        let Ok((_, Ok(child))) = outcome else {
            panic!("a thread panicked");
        };
        assert!(matches!(child, Ok(false)), "{child:?}");
    }
}
