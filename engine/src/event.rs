//! A single-threaded "notify all" event for tasks on one shard executor (used by the engine and
//! by the network layer's per-shard endpoint).
//!
//! glommio has no Notify primitive; this one is a generation counter plus the wakers of the tasks
//! waiting for the generation to move. It is `!Send` on purpose: it never crosses cores.

use std::{
    cell::{Cell, RefCell},
    future::Future,
    pin::Pin,
    task::{Context, Poll, Waker},
};

/// Wakes every task waiting on it; see the module docs.
#[derive(Default)]
pub struct Event {
    generation: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

impl Event {
    /// A future that completes at the next `notify_all` after this call.
    pub fn listen(&self) -> Listen<'_> {
        Listen {
            event: self,
            start: self.generation.get(),
        }
    }

    /// Wakes every current listener.
    pub fn notify_all(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }
}

/// The future returned by [`Event::listen`].
pub struct Listen<'a> {
    event: &'a Event,
    start: u64,
}

impl Future for Listen<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.event.generation.get() != self.start {
            return Poll::Ready(());
        }
        let mut waiters = self.event.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }
}
