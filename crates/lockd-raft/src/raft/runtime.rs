//! openraft's async runtime for lockd: tokio, with a seedable source of randomness.
//!
//! openraft draws every random number (election timeouts, first tick waits) through
//! `AsyncRuntime::thread_rng()`. [`LockdRuntime`] delegates everything to openraft's tokio
//! runtime except that: each call returns a `SmallRng` seeded from a per-thread seed stream.
//! In production the stream is seeded from entropy on first use; the simulator calls
//! [`seed_thread_rng`] on its (single) runtime thread first, so a seed reproduces a run.
//! Its watch channel is [`crate::watch`]: tokio's wakes receivers in a random order.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::time::Duration;

use openraft::OptionalSend;
use openraft_rt::{AsyncRuntime, Select2, Select3, Select4};
use openraft_rt_tokio::TokioRuntime;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

thread_local! {
    /// SplitMix64 state of this thread's seed stream; `None` until first use or seeding.
    static SEED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Seeds this thread's RNG stream (the simulator: one current-thread runtime per seed).
/// `None` goes back to an entropy seed on next use.
pub fn seed_thread_rng(seed: Option<u64>) {
    SEED.with(|s| s.set(seed));
}

/// SplitMix64: the next seed of the stream.
fn next_seed() -> u64 {
    SEED.with(|s| {
        let state = s.get().unwrap_or_else(|| rand::rng().random());
        let z = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(Some(z));
        let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// openraft's tokio runtime with a seedable `thread_rng`.
#[derive(Debug)]
pub struct LockdRuntime(TokioRuntime);

impl AsyncRuntime for LockdRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn select2<A, B>(
        a: A,
        b: B,
    ) -> impl Future<Output = Select2<A::Output, B::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
    {
        TokioRuntime::select2(a, b)
    }

    fn select3<A, B, C>(
        a: A,
        b: B,
        c: C,
    ) -> impl Future<Output = Select3<A::Output, B::Output, C::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
    {
        TokioRuntime::select3(a, b, c)
    }

    fn select4<A, B, C, D>(
        a: A,
        b: B,
        c: C,
        d: D,
    ) -> impl Future<Output = Select4<A::Output, B::Output, C::Output, D::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
        D: Future + OptionalSend,
    {
        TokioRuntime::select4(a, b, c, d)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SmallRng::seed_from_u64(next_seed())
    }

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = DetWatch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        LockdRuntime(TokioRuntime::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }

    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        TokioRuntime::spawn_blocking(f)
    }
}

/// openraft's watch over [`crate::watch`] (deterministic wake-up order).
pub struct DetWatch;

/// Sender half of [`DetWatch`].
pub struct DetSender<T>(crate::watch::Sender<T>);

/// Receiver half of [`DetWatch`].
pub struct DetReceiver<T>(crate::watch::Receiver<T>);

impl<T> Clone for DetSender<T> {
    fn clone(&self) -> Self {
        DetSender(self.0.clone())
    }
}

impl<T> Clone for DetReceiver<T> {
    fn clone(&self) -> Self {
        DetReceiver(self.0.clone())
    }
}

impl openraft_rt::watch::Watch for DetWatch {
    type Sender<T: OptionalSend + openraft_rt::OptionalSync> = DetSender<T>;
    type Receiver<T: OptionalSend + openraft_rt::OptionalSync> = DetReceiver<T>;
    type Ref<'a, T: OptionalSend + 'a> = crate::watch::Ref<'a, T>;

    fn channel<T: OptionalSend + openraft_rt::OptionalSync>(
        init: T,
    ) -> (Self::Sender<T>, Self::Receiver<T>) {
        let (tx, rx) = crate::watch::channel(init);
        (DetSender(tx), DetReceiver(rx))
    }
}

impl<T> openraft_rt::watch::WatchSender<DetWatch, T> for DetSender<T>
where
    T: OptionalSend + openraft_rt::OptionalSync,
{
    fn send(&self, value: T) -> Result<(), openraft_rt::watch::SendError<T>> {
        self.0.send_replace(value);
        Ok(())
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        self.0.send_if_modified(modify)
    }

    fn borrow_watched(&self) -> crate::watch::Ref<'_, T> {
        self.0.borrow()
    }

    fn subscribe(&self) -> DetReceiver<T> {
        DetReceiver(self.0.subscribe())
    }
}

impl<T> openraft_rt::watch::WatchReceiver<DetWatch, T> for DetReceiver<T>
where
    T: OptionalSend + openraft_rt::OptionalSync,
{
    async fn changed(&mut self) -> Result<(), openraft_rt::watch::RecvError> {
        self.0
            .changed()
            .await
            .map_err(|_| openraft_rt::watch::RecvError(()))
    }

    fn borrow_watched(&self) -> crate::watch::Ref<'_, T> {
        self.0.borrow()
    }

    fn borrow_and_update(&mut self) -> crate::watch::Ref<'_, T> {
        self.0.borrow_and_update()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    #[test]
    fn a_seed_reproduces_the_stream() {
        let draw = || -> Vec<u64> {
            (0..4)
                .map(|_| LockdRuntime::thread_rng().random_range(0..1_000_000))
                .collect()
        };
        seed_thread_rng(Some(7));
        let a = draw();
        seed_thread_rng(Some(7));
        assert_eq!(a, draw());
        seed_thread_rng(Some(8));
        assert_ne!(a, draw());
        seed_thread_rng(None);
    }
}
