//! Keeping the store's thread awake for a moment after each request
//! (`ferroplasma store --spin-us`, 50 µs by default, 0 turns it off).
//!
//! A thread that parks and is woken again costs far more than a short
//! request takes: on a virtual machine, the wake-up of an idle CPU is a
//! trip through the hypervisor (a 1-byte round trip over a Unix socket on
//! this project's 2-core VM: 70 µs when both sides block, 27–29 µs when
//! one side polls, 5 µs when both do). So after the store handles a
//! request, a task of its own keeps its runtime from parking for the
//! window: it yields to the scheduler over and over (and the thread to any
//! other thread that wants the CPU, so a busy machine loses nothing), and each time tokio
//! polls the socket readiness without blocking (`epoll_wait` with no
//! timeout), so the next request of any client is picked up without a
//! wake-up. Each request restarts the window; after a window with no
//! request the runtime parks as before. Clients do the same on their side
//! (`FERROPLASMA_SPIN_US`). The cost is the window's CPU time after the
//! last request of a burst.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The default window, µs.
pub const DEFAULT_SPIN_US: u32 = 50;
/// The longest window `--spin-us` takes, µs.
pub const MAX_SPIN_US: u32 = 10_000;

/// The store's spinner: poked by every connection that handled a request.
#[derive(Debug, Default)]
pub struct Spin {
    /// Requests handled (the spinner restarts its window when it moves).
    pokes: AtomicU64,
    /// The spinner is parked, waiting for a poke.
    parked: AtomicBool,
    wake: Notify,
}

impl Spin {
    /// A request was handled: keep the runtime awake for another window.
    pub fn poke(&self) {
        self.pokes.fetch_add(1, Ordering::Relaxed);
        // Only the poke that finds it parked wakes it: more would leave a
        // permit that starts a window no request asked for.
        if self.parked.swap(false, Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }

    /// Runs the spinner on the current runtime (a task of its own) with
    /// `window`; returns at once when it is zero.
    pub async fn run(self: Arc<Self>, window: Duration) {
        if window.is_zero() {
            return;
        }
        loop {
            self.parked.store(true, Ordering::Relaxed);
            let seen = self.pokes.load(Ordering::Relaxed);
            let poked = self.wake.notified();
            tokio::pin!(poked);
            poked.as_mut().enable();
            if self.pokes.load(Ordering::Relaxed) == seen {
                poked.await;
            }
            self.parked.store(false, Ordering::Relaxed);
            self.spin(window).await;
        }
    }

    /// Yields until `window` passes with no poke.
    async fn spin(&self, window: Duration) {
        let mut seen = self.pokes.load(Ordering::Relaxed);
        let mut until = Instant::now() + window;
        loop {
            tokio::task::yield_now().await;
            // The thread stays runnable (its CPU does not halt), but any
            // other thread that wants the CPU gets it first.
            std::thread::yield_now();
            let now = Instant::now();
            let pokes = self.pokes.load(Ordering::Relaxed);
            if pokes != seen {
                (seen, until) = (pokes, now + window);
            } else if now >= until {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_poke_keeps_the_runtime_awake_for_the_window_then_it_parks() {
        let spin = Arc::new(Spin::default());
        let task = tokio::spawn(spin.clone().run(Duration::from_millis(30)));
        tokio::task::yield_now().await;
        assert!(spin.parked.load(Ordering::Relaxed), "parked until poked");
        spin.poke();
        tokio::task::yield_now().await;
        assert!(
            !spin.parked.load(Ordering::Relaxed),
            "spinning after a poke"
        );
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(
            spin.parked.load(Ordering::Relaxed),
            "parked again after the window"
        );
        // Pokes while spinning extend the window, and leave no wake-up
        // behind: once the last window passes, it parks.
        for _ in 0..5 {
            spin.poke();
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert!(!spin.parked.load(Ordering::Relaxed), "each poke extends it");
        }
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(spin.parked.load(Ordering::Relaxed));
        task.abort();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_zero_window_never_spins() {
        let spin = Arc::new(Spin::default());
        tokio::time::timeout(Duration::from_secs(5), spin.clone().run(Duration::ZERO))
            .await
            .expect("returns at once");
        spin.poke();
    }
}
