//! A fair share of the host's guest threads between pipelines.
//!
//! Guests run on the runtime's own threads (one per core), time-sliced on every epoch tick. A
//! call that ends within its first tick never asks for a turn: cheap plugins run as they come.
//! A call that computes longer holds a turn for each tick it runs, and at every tick gives its
//! turn back when another guest waits for one. Turns go to the waiting tenant that holds the
//! fewest, ties round-robin, and no tenant holds more than its share: the turns divided by the
//! tenants active now (a call under way or begun within [`ACTIVE_WINDOW`]), at least one. So a
//! tenant with many instances spinning to their deadlines gets no more of the threads than
//! one with a single busy instance, and no more than its share even while the others' calls
//! are too short to ask for a turn: what it leaves is left to them (and to the host's own
//! threads), not taken because it is free. Alone, a tenant may use every turn. Written here
//! because it is a few lines of policy over tokio's oneshot channels, and no scheduler crate
//! gives per-tenant fairness to futures that already yield at a tick of their own.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long after its last call began a tenant still counts as active (and so keeps its share
/// of the turns from a busy neighbour).
pub(crate) const ACTIVE_WINDOW: Duration = Duration::from_secs(1);

/// The gate guests pass on every tick past their first; one per runtime.
pub(crate) struct Turns {
    slots: usize,
    state: Mutex<State>,
    /// Epoch ticks so far (the ticker counts them here), so a guest can tell the tick's own
    /// exit to the host from a host call of its own.
    ticks: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Turns held right now, by every tenant.
    held: usize,
    /// Waiters not yet granted (some may have given up: their receiver is gone).
    waiting: usize,
    /// Every tenant that ever asked (one per pipeline name: few, and kept for their counts).
    tenants: BTreeMap<Arc<str>, Tenant>,
    /// The tenant that got the last contended turn: ties go to the next one after it.
    last: Option<Arc<str>>,
}

#[derive(Default)]
struct Tenant {
    held: usize,
    waiters: VecDeque<oneshot::Sender<Turn>>,
    granted: u64,
    /// Calls under way.
    calls: usize,
    /// When its last call began.
    last_call: Option<Instant>,
}

impl Tenant {
    /// Computing (holding or waiting for a turn), in a call, or in one a moment ago.
    fn active(&self, now: Instant) -> bool {
        self.held > 0
            || !self.waiters.is_empty()
            || self.calls > 0
            || self
                .last_call
                .is_some_and(|t| now.duration_since(t) < ACTIVE_WINDOW)
    }
}

impl State {
    /// The most turns one tenant may hold now: the turns divided by the active tenants (the
    /// one asking is active itself, so this is never below one).
    fn cap(&self, slots: usize) -> usize {
        let now = Instant::now();
        let active = self.tenants.values().filter(|t| t.active(now)).count();
        (slots / active.max(1)).max(1)
    }
}

/// One turn of a tenant on the guest threads; dropping it gives it to the next waiter.
pub(crate) struct Turn {
    turns: Arc<Turns>,
    tenant: Arc<str>,
    /// False for a turn that never reached its waiter: its counts are undone by the grant
    /// loop itself, not by `Drop`.
    armed: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.armed {
            self.turns.release(&self.tenant);
        }
    }
}

/// A guest call under way (see [`Turns::call_began`]); dropped when it ends or is abandoned.
pub(crate) struct CallUnderWay {
    turns: Arc<Turns>,
    tenant: Arc<str>,
}

impl Drop for CallUnderWay {
    fn drop(&mut self) {
        if let Some(t) = self.turns.lock().tenants.get_mut(&self.tenant) {
            t.calls = t.calls.saturating_sub(1);
        }
    }
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("tenant", &self.tenant)
            .finish()
    }
}

impl Turns {
    /// A gate of `slots` turns (at least one).
    pub(crate) fn new(slots: usize) -> Arc<Self> {
        Arc::new(Turns {
            slots: slots.max(1),
            state: Mutex::new(State::default()),
            ticks: AtomicU64::new(0),
        })
    }

    /// Called by the epoch ticker on every tick.
    pub(crate) fn tick(&self) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
    }

    /// Ticks so far.
    pub(crate) fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a guest waits for a turn: only then does a running guest give its turn back.
    pub(crate) fn contended(&self) -> bool {
        self.lock().waiting > 0
    }

    /// A call of `tenant` begins: it counts as active (see [`ACTIVE_WINDOW`]) until the guard
    /// is dropped, and for the window after.
    pub(crate) fn call_began(self: &Arc<Self>, tenant: &Arc<str>) -> CallUnderWay {
        let mut st = self.lock();
        let t = st.tenants.entry(tenant.clone()).or_default();
        t.calls += 1;
        t.last_call = Some(Instant::now());
        CallUnderWay {
            turns: self.clone(),
            tenant: tenant.clone(),
        }
    }

    /// A turn for `tenant`: at once when one is free and nobody waits, else when the policy
    /// picks this tenant. Cancel-safe: a waiter that gives up passes its grant on.
    pub(crate) async fn acquire(self: &Arc<Self>, tenant: &Arc<str>) -> Turn {
        let rx = {
            let mut st = self.lock();
            let cap = st.cap(self.slots);
            let own = st.tenants.get(tenant).map_or(0, |t| t.held);
            if st.held < self.slots && st.waiting == 0 && own < cap {
                st.held += 1;
                let t = st.tenants.entry(tenant.clone()).or_default();
                t.held += 1;
                t.granted += 1;
                st.last = Some(tenant.clone());
                return self.turn(tenant);
            }
            let (tx, rx) = oneshot::channel();
            st.tenants
                .entry(tenant.clone())
                .or_default()
                .waiters
                .push_back(tx);
            st.waiting += 1;
            rx
        };
        self.grant();
        match rx.await {
            Ok(turn) => turn,
            // The gate is gone only with its runtime; run on rather than hang.
            Err(_) => Turn {
                turns: self.clone(),
                tenant: tenant.clone(),
                armed: false,
            },
        }
    }

    /// Turns granted to `tenant` so far (for tests and status).
    pub(crate) fn granted(&self, tenant: &str) -> u64 {
        self.lock().tenants.get(tenant).map_or(0, |t| t.granted)
    }

    fn turn(self: &Arc<Self>, tenant: &Arc<str>) -> Turn {
        Turn {
            turns: self.clone(),
            tenant: tenant.clone(),
            armed: true,
        }
    }

    fn release(self: &Arc<Self>, tenant: &Arc<str>) {
        {
            let mut st = self.lock();
            st.held = st.held.saturating_sub(1);
            if let Some(t) = st.tenants.get_mut(tenant) {
                t.held = t.held.saturating_sub(1);
            }
        }
        self.grant();
    }

    /// Hands free turns to waiters while there are both. Sends happen outside the lock; a
    /// waiter that gave up has its counts undone here and the turn goes to the next.
    fn grant(self: &Arc<Self>) {
        loop {
            let (tx, tenant) = {
                let mut st = self.lock();
                if st.held >= self.slots || st.waiting == 0 {
                    return;
                }
                let cap = st.cap(self.slots);
                let Some(name) = pick(&st, cap) else {
                    // Every waiter's tenant holds its share (or gave up): they wait for a
                    // turn of their own to come back.
                    return;
                };
                st.waiting -= 1;
                st.held += 1;
                st.last = Some(name.clone());
                let t = st.tenants.get_mut(&name).expect("picked tenant exists");
                t.held += 1;
                t.granted += 1;
                let tx = t.waiters.pop_front().expect("picked tenant waits");
                (tx, name)
            };
            if let Err(mut turn) = tx.send(self.turn(&tenant)) {
                turn.armed = false;
                let mut st = self.lock();
                st.held = st.held.saturating_sub(1);
                if let Some(t) = st.tenants.get_mut(&tenant) {
                    t.held = t.held.saturating_sub(1);
                    t.granted = t.granted.saturating_sub(1);
                }
            }
        }
    }
}

/// The waiting tenant below `cap` holding the fewest turns; among equals, the first after the
/// last one served (round-robin).
fn pick(st: &State, cap: usize) -> Option<Arc<str>> {
    let fewest = st
        .tenants
        .values()
        .filter(|t| !t.waiters.is_empty() && t.held < cap)
        .map(|t| t.held)
        .min()?;
    let candidates = || {
        st.tenants
            .iter()
            .filter(|(_, t)| !t.waiters.is_empty() && t.held == fewest)
            .map(|(name, _)| name)
    };
    let after = st
        .last
        .as_ref()
        .and_then(|last| candidates().find(|name| *name > last));
    after.or_else(|| candidates().next()).cloned()
}

/// A store's place at the [`Turns`] gate: the turn it holds (if any), under its tenant (the
/// pipeline's name).
/// Shared with the tick's yield future, which gives the turn back and waits for the next.
pub(crate) struct TurnSlot {
    turns: Arc<Turns>,
    tenant: Arc<str>,
    held: Arc<Mutex<Option<Turn>>>,
    /// The tick at which the guest's epoch deadline falls (one past the tick it last resumed
    /// at): a host call made before it is the guest's own, one made at or after it is
    /// (almost always) the epoch check itself, which must not give the turn away.
    next_tick: Arc<AtomicU64>,
    /// The call under way (its tenant counts as active meanwhile).
    call: Option<CallUnderWay>,
}

impl TurnSlot {
    /// A slot at `turns` for the calls of `tenant`.
    pub(crate) fn new(turns: Arc<Turns>, tenant: Arc<str>) -> Self {
        TurnSlot {
            turns,
            tenant,
            held: Arc::new(Mutex::new(None)),
            next_tick: Arc::new(AtomicU64::new(0)),
            call: None,
        }
    }

    /// A call begins, with an epoch deadline of one tick.
    pub(crate) fn started(&mut self) {
        self.call = Some(self.turns.call_began(&self.tenant));
        self.next_tick
            .store(self.turns.ticks() + 1, Ordering::Relaxed);
    }

    /// The call ended: its turn goes back, and it no longer keeps its tenant active.
    pub(crate) fn finished(&mut self) {
        self.give_back();
        self.call = None;
    }

    /// A host call begins: one that may wait (HTTP) holds no turn while it does. The epoch
    /// check is a host call too, and there the tick's own logic decides.
    pub(crate) fn entering_host(&self) {
        if self.turns.ticks() < self.next_tick.load(Ordering::Relaxed) {
            self.give_back();
        }
    }

    fn held(&self) -> MutexGuard<'_, Option<Turn>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the guest awaits at a tick: a yield to the other tasks on its thread, then a
    /// turn. A guest that holds one keeps it unless a guest of another waits (the gate's
    /// policy decides who runs next); one that holds none (its first tick, or back from a
    /// host call) queues for one.
    pub(crate) fn next_slice(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let (turns, tenant, held) = (self.turns.clone(), self.tenant.clone(), self.held.clone());
        let next_tick = self.next_tick.clone();
        Box::pin(async move {
            tokio::task::yield_now().await;
            let given_back = {
                let mut slot = held.lock().unwrap_or_else(|e| e.into_inner());
                if slot.is_some() && !turns.contended() {
                    next_tick.store(turns.ticks() + 1, Ordering::Relaxed);
                    return;
                }
                slot.take()
            };
            // Given back first, so that the gate can hand it to whoever waits.
            drop(given_back);
            let turn = turns.acquire(&tenant).await;
            *held.lock().unwrap_or_else(|e| e.into_inner()) = Some(turn);
            next_tick.store(turns.ticks() + 1, Ordering::Relaxed);
        })
    }

    /// Gives the turn back (the call ended, or entered a host call that may wait).
    pub(crate) fn give_back(&self) {
        let turn = self.held().take();
        drop(turn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[tokio::test]
    async fn a_free_turn_is_taken_at_once_and_given_back_on_drop() {
        let turns = Turns::new(1);
        let a = name("a");
        let t = turns.acquire(&a).await;
        assert!(!turns.contended());
        drop(t);
        let _again = turns.acquire(&a).await;
        assert_eq!(turns.granted("a"), 2);
    }

    #[tokio::test]
    async fn a_tenant_with_many_waiters_does_not_crowd_out_one_with_few() {
        let turns = Turns::new(1);
        let (a, b) = (name("a"), name("b"));
        let held = turns.acquire(&a).await;
        // Four of a's instances wait, then one of b's.
        let mut a_waiting = Vec::new();
        for _ in 0..4 {
            let (turns, a) = (turns.clone(), a.clone());
            a_waiting.push(tokio::spawn(async move { turns.acquire(&a).await }));
        }
        tokio::task::yield_now().await;
        let (t2, b2) = (turns.clone(), b.clone());
        let b_waiting = tokio::spawn(async move { t2.acquire(&b2).await });
        while turns.lock().waiting < 5 {
            tokio::task::yield_now().await;
        }
        assert!(turns.contended());
        drop(held);
        // a held the last turn, so b (round-robin after a) gets the freed one.
        let b_turn = b_waiting.await.expect("b");
        assert_eq!(turns.granted("b"), 1);
        assert_eq!(turns.granted("a"), 1, "no waiting a got a turn before b");
        drop(b_turn);
        for w in a_waiting {
            drop(w.await.expect("a"));
        }
        assert_eq!(turns.granted("a"), 5);
        assert!(!turns.contended());
    }

    #[tokio::test]
    async fn turns_alternate_between_tenants_that_both_keep_waiting() {
        let turns = Turns::new(1);
        let (a, b) = (name("a"), name("b"));
        let mut order = Vec::new();
        let first = turns.acquire(&a).await;
        let mut pending: Vec<(Arc<str>, oneshot::Receiver<Turn>)> = Vec::new();
        for who in [&a, &a, &a, &b, &b, &b] {
            let (tx, rx) = oneshot::channel();
            let (turns, who2) = (turns.clone(), who.clone());
            tokio::spawn(async move {
                let t = turns.acquire(&who2).await;
                let _ = tx.send(t);
            });
            tokio::task::yield_now().await;
            pending.push((who.clone(), rx));
        }
        while turns.lock().waiting < 6 {
            tokio::task::yield_now().await;
        }
        drop(first);
        for _ in 0..6 {
            // Exactly one waiter holds the single turn; find it, note it, give it back.
            let (i, turn) = loop {
                let mut got = None;
                for (i, (_, rx)) in pending.iter_mut().enumerate() {
                    if let Ok(t) = rx.try_recv() {
                        got = Some((i, t));
                        break;
                    }
                }
                if let Some(g) = got {
                    break g;
                }
                tokio::task::yield_now().await;
            };
            let (who, _) = pending.remove(i);
            order.push(who.to_string());
            drop(turn);
        }
        assert_eq!(order, ["b", "a", "b", "a", "b", "a"]);
    }

    #[tokio::test]
    async fn a_tenant_gets_no_more_than_its_share_while_another_is_active() {
        let turns = Turns::new(2);
        let (a, b) = (name("a"), name("b"));
        let _first = turns.acquire(&a).await;
        // Alone, a may take the second turn too.
        let second = turns.acquire(&a).await;
        drop(second);
        // b's calls are short (they never ask for a turn), but b is active: a's share is one.
        let call = turns.call_began(&b);
        let (t2, a2) = (turns.clone(), a.clone());
        let mut waiting = tokio::spawn(async move { t2.acquire(&a2).await });
        while !turns.contended() {
            tokio::task::yield_now().await;
        }
        assert!(
            futures::poll!(&mut waiting).is_pending(),
            "a free turn is left to b"
        );
        assert_eq!(turns.lock().held, 1);
        drop(call);
        drop(_first);
        // a's own turn came back: its waiter gets it.
        let _t = waiting.await.expect("a");
        assert_eq!(turns.lock().held, 1);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_passes_its_turn_on() {
        let turns = Turns::new(1);
        let (a, b) = (name("a"), name("b"));
        let held = turns.acquire(&a).await;
        let (t2, b2) = (turns.clone(), b.clone());
        let gave_up = tokio::spawn(async move { t2.acquire(&b2).await });
        while !turns.contended() {
            tokio::task::yield_now().await;
        }
        gave_up.abort();
        let _ = gave_up.await;
        drop(held);
        // The abandoned grant was undone: a gets the one turn at once.
        let _t = turns.acquire(&a).await;
        assert_eq!(turns.granted("b"), 0);
        assert_eq!(turns.lock().held, 1);
    }
}
