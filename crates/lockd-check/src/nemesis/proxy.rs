//! A fault-injecting TCP proxy for one directed link between two lockd nodes.
//!
//! Node A reaches node B's peer port through the proxy of link A→B (each node's own `--peers`
//! names the proxies), so cutting A→B and B→A partitions the pair while clients still reach
//! both nodes directly. While a link is cut, its open connections are dropped and new ones are
//! accepted but carry nothing (a black hole, as a real partition looks to TCP); when it heals,
//! those are closed so the peer reconnects.

use std::net::SocketAddr;

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
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let listen = listener.local_addr()?;
        let (cut, rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, target, rx));
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

async fn accept_loop(listener: TcpListener, target: SocketAddr, cut: watch::Receiver<bool>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        let _ = inbound.set_nodelay(true);
        tokio::spawn(forward(inbound, target, cut.clone()));
    }
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
