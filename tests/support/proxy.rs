//! A loopback TCP proxy the test controls: it forwards every connection to the broker until the
//! test cuts them all at once, as a failing network path or a load balancer would. The broker's
//! `PROXIED` listener (see `dev/kafka`) advertises the proxy's address, so every connection a
//! client opens after bootstrap goes through it too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; dropping it stops accepting and closes every connection.
pub struct Proxy {
    cuts: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    lose_answer: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
    addr: SocketAddr,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on `listen` and forwards each connection to `target`.
    pub async fn start(listen: &str, target: &str) -> Proxy {
        let listener = TcpListener::bind(listen)
            .await
            .unwrap_or_else(|e| panic!("proxy cannot listen on {listen}: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy on {listen} has no address: {e}"));
        let (cuts, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let lose_answer = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicUsize::new(0));
        let (tx, count, live, lose, lost_count, target) = (
            cuts.clone(),
            accepted.clone(),
            open.clone(),
            lose_answer.clone(),
            lost.clone(),
            target.to_owned(),
        );
        let accept_task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let mut cut = tx.subscribe();
                let (target, live, lose, lost_count) = (
                    target.clone(),
                    live.clone(),
                    lose.clone(),
                    lost_count.clone(),
                );
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return; // the broker is down: the client sees its connection close
                    };
                    live.fetch_add(1, Ordering::SeqCst);
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let requests = tokio::io::copy(&mut client_read, &mut server_write);
                    // The broker's bytes, unless the test asked to lose the next answer: then
                    // they are dropped and the connection cut, after the broker served it.
                    let answers = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match server_read.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if lose.swap(false, Ordering::SeqCst) {
                                lost_count.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                            if client_write.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        _ = requests => {}
                        _ = answers => {}
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
            lose_answer,
            lost,
            addr,
            accept_task,
        }
    }

    /// Where the proxy listens (its port, when it was started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next bytes the broker sends on any connection are dropped and that connection cut:
    /// the broker served a request whose answer the client never sees (a connection that dies
    /// between the broker's append and its reply).
    pub fn lose_next_answer(&self) {
        self.lose_answer.store(true, Ordering::SeqCst);
    }

    /// Answers dropped so far by [`Proxy::lose_next_answer`].
    pub fn lost_answers(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
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
