//! A loopback TCP proxy the test controls: it forwards every connection to the broker until the
//! test cuts them all at once, as a failing network path or a load balancer would. The broker's
//! `PROXIED` listener (see `dev/kafka`) advertises the proxy's address, so every connection a
//! client opens after bootstrap goes through it too.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; dropping it stops accepting and closes every connection.
pub struct Proxy {
    cuts: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on `listen` and forwards each connection to `target`.
    pub async fn start(listen: &str, target: &str) -> Proxy {
        let listener = TcpListener::bind(listen)
            .await
            .unwrap_or_else(|e| panic!("proxy cannot listen on {listen}: {e}"));
        let (cuts, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (tx, count, live, target) = (
            cuts.clone(),
            accepted.clone(),
            open.clone(),
            target.to_owned(),
        );
        let accept_task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let mut cut = tx.subscribe();
                let (target, live) = (target.clone(), live.clone());
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else {
                        return; // the broker is down: the client sees its connection close
                    };
                    live.fetch_add(1, Ordering::SeqCst);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                    live.fetch_sub(1, Ordering::SeqCst);
                    // Both sockets drop here: each side sees its connection end mid-stream.
                });
            }
        });
        Proxy {
            cuts,
            accepted,
            open,
            accept_task,
        }
    }

    /// Cuts every connection open now (new ones are still accepted); returns how many were open.
    pub fn cut_all(&self) -> usize {
        let open = self.open.load(Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
        open
    }

    /// Connections accepted so far (a client that reconnects after a cut adds to it).
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.cuts.send_modify(|n| *n += 1);
    }
}
