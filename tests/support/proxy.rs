//! A loopback TCP proxy the test controls: it forwards every connection to the broker until the
//! test cuts them all at once, as a failing network path or a load balancer would. The broker's
//! `PROXIED` listener (see `dev/kafka`) advertises the proxy's address, so every connection a
//! client opens after bootstrap goes through it too.
//!
//! It can also cut a path on one side only: [`Proxy::strand_share_sessions`] closes the broker's
//! end of every connection that has carried a share session's requests and keeps the client's
//! end open, unanswered, as a network partition the broker notices first would.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; dropping it stops accepting and closes every connection.
pub struct Proxy {
    cuts: watch::Sender<u64>,
    strands: watch::Sender<u64>,
    share_open: Arc<AtomicUsize>,
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
        let (strands, _) = watch::channel(0u64);
        let share_open = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let lose_answer = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicUsize::new(0));
        let (strand_tx, share_live) = (strands.clone(), share_open.clone());
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
                let mut strand = strand_tx.subscribe();
                let (target, live, lose, lost_count, share_live) = (
                    target.clone(),
                    live.clone(),
                    lose.clone(),
                    lost_count.clone(),
                    share_live.clone(),
                );
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return; // the broker is down: the client sees its connection close
                    };
                    live.fetch_add(1, Ordering::SeqCst);
                    let share = AtomicBool::new(false);
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let stranded = {
                        let requests = forward_requests(
                            &mut client_read,
                            &mut server_write,
                            &share,
                            &share_live,
                        );
                        // The broker's bytes, unless the test asked to lose the next answer:
                        // then they are dropped and the connection cut, after the broker
                        // served it.
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
                        tokio::pin!(requests, answers);
                        loop {
                            tokio::select! {
                                _ = &mut requests => break false,
                                _ = &mut answers => break false,
                                _ = cut.changed() => break false,
                                _ = strand.changed() => {
                                    if share.load(Ordering::SeqCst) {
                                        break true;
                                    }
                                }
                            }
                        }
                    };
                    if stranded {
                        // The broker sees its connection end; the client's stays open, and
                        // what it sends is read and never answered.
                        drop((server_read, server_write));
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            tokio::select! {
                                r = client_read.read(&mut buf) => {
                                    if matches!(r, Ok(0) | Err(_)) {
                                        break;
                                    }
                                }
                                _ = cut.changed() => break,
                            }
                        }
                    }
                    if share.load(Ordering::SeqCst) {
                        share_live.fetch_sub(1, Ordering::SeqCst);
                    }
                    live.fetch_sub(1, Ordering::SeqCst);
                    drop(client_write);
                    // Both sockets drop here: each side sees its connection end mid-stream.
                });
            }
        });
        Proxy {
            cuts,
            strands,
            share_open,
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

    /// Closes the broker's end of every open connection that has carried a share session's
    /// requests (ShareFetch, ShareAcknowledge) and keeps the client's end open, never answering
    /// it: the broker ends those sessions and releases what they held while the client sees
    /// nothing but silence. Other connections (produce, heartbeats) go on. Returns how many
    /// were stranded.
    pub fn strand_share_sessions(&self) -> usize {
        let open = self.share_open.load(Ordering::SeqCst);
        self.strands.send_modify(|n| *n += 1);
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

/// Kafka's API keys for a share session's requests.
const SHARE_FETCH: i16 = 78;
const SHARE_ACKNOWLEDGE: i16 = 79;

/// Copies the client's requests to the broker, reading each request's size and API key from
/// its header on the way (a request may arrive in pieces): the first ShareFetch or
/// ShareAcknowledge marks the connection as a share session's (`share`, counted in `open`).
async fn forward_requests(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    share: &AtomicBool,
    open: &AtomicUsize,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut header: Vec<u8> = Vec::with_capacity(6);
    let mut skip = 0usize;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut i = 0;
        while i < n {
            if skip > 0 {
                let k = skip.min(n - i);
                skip -= k;
                i += k;
                continue;
            }
            header.push(buf[i]);
            i += 1;
            if header.len() == 6 {
                let size = i32::from_be_bytes([header[0], header[1], header[2], header[3]]);
                let api = i16::from_be_bytes([header[4], header[5]]);
                if (api == SHARE_FETCH || api == SHARE_ACKNOWLEDGE)
                    && !share.swap(true, Ordering::SeqCst)
                {
                    open.fetch_add(1, Ordering::SeqCst);
                }
                skip = usize::try_from(size).unwrap_or(0).saturating_sub(2);
                header.clear();
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
