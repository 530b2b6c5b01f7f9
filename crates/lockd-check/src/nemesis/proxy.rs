//! A fault-injecting TCP proxy for one directed link between two lockd nodes.
//!
//! Node A reaches node B's peer port through the proxy of link A→B (each node's own `--peers`
//! names the proxies), so cutting A→B and B→A partitions the pair while clients still reach
//! both nodes directly. While a link is cut, its open connections are dropped and new ones are
//! accepted but carry nothing (a black hole, as a real partition looks to TCP); when it heals,
//! those are closed so the peer reconnects.
//!
//! A link may also delay every byte by a fixed time each way, as a link between zones does
//! (`lockd-check latency`). The delay is kept by a thread per direction with
//! `std::thread::sleep`, which keeps microseconds (tokio's timer ticks in whole milliseconds,
//! which would turn 0.5 ms into 1 ms); chunks are stamped when read and sent when due, so the
//! line stays pipelined and its bandwidth is not cut. A delayed link cannot be cut.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; dropping it stops accepting (connections end with the runtime).
pub struct Link {
    pub listen: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Listens on a free loopback port and forwards to `target`, each way `delay` later.
    pub async fn start(target: SocketAddr, delay: Duration) -> std::io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let listen = listener.local_addr()?;
        let (cut, rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, target, rx, delay));
        Ok(Link { listen, cut, task })
    }

    /// Cuts (`true`) or heals (`false`) the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    pub fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: watch::Receiver<bool>,
    delay: Duration,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        let _ = inbound.set_nodelay(true);
        if delay.is_zero() {
            tokio::spawn(forward(inbound, target, cut.clone()));
        } else {
            tokio::spawn(forward_delayed(inbound, target, delay));
        }
    }
}

/// Forwards both ways on threads, each chunk `delay` after it was read.
async fn forward_delayed(inbound: TcpStream, target: SocketAddr, delay: Duration) {
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    let blocking = |s: TcpStream| {
        let s = s.into_std()?;
        s.set_nonblocking(false)?;
        s.try_clone().map(|c| (s, c))
    };
    let (Ok((a, a2)), Ok((b, b2))) = (blocking(inbound), blocking(outbound)) else {
        return;
    };
    delayed_line(a, b2, delay);
    delayed_line(b, a2, delay);
}

/// One direction: a reader stamps each chunk with when it is due, a writer sends it then.
/// Either end closing ends both threads (the writer shuts its side down after the backlog).
fn delayed_line(mut from: std::net::TcpStream, mut to: std::net::TcpStream, delay: Duration) {
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

async fn forward(mut inbound: TcpStream, target: SocketAddr, mut cut: watch::Receiver<bool>) {
    if *cut.borrow_and_update() {
        // Black hole until healed, then close.
        let _ = cut.wait_for(|c| !*c).await;
        return;
    }
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server on loopback; its address.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(link: &Link, bytes: &[u8]) -> Duration {
        let mut s = TcpStream::connect(link.listen).await.unwrap();
        s.set_nodelay(true).unwrap();
        let start = Instant::now();
        s.write_all(bytes).await.unwrap();
        let mut back = vec![0u8; bytes.len()];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(back, bytes, "the bytes come back as sent");
        start.elapsed()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delayed_link_delays_each_way_and_keeps_the_bytes() {
        let target = echo().await;
        let delay = Duration::from_millis(20);
        let link = Link::start(target, delay).await.unwrap();
        // Through the proxy and back: the delay each way.
        let took = round_trip(&link, b"ping").await;
        assert!(took >= 2 * delay, "a round trip took {took:?}");
        assert!(took < Duration::from_secs(2), "a round trip took {took:?}");
        // Larger than one read: still every byte, in order.
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        round_trip(&link, &big).await;
        // No delay: the plain forwarder.
        let plain = Link::start(target, Duration::ZERO).await.unwrap();
        assert!(round_trip(&plain, b"ping").await < 2 * delay);
    }
}
