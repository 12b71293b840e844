//! What judges a batch: a sandboxed plugin instance, or a trusted native handler run through the
//! same pipeline (the benchmark's way to measure what the sandbox alone costs).

use std::sync::Arc;

use crate::runtime::{BatchOutcome, Fault, FaultKind, Judged, Plugin, Record, Verdict};

/// Most extra plugin calls spent isolating poison records in a faulting batch (a pipeline's,
/// and `test-plugin`'s, which shows what a pipeline would do).
pub const MAX_ISOLATION_CALLS: usize = 16;

/// A trusted batch handler compiled into the process, in place of a Wasm component. It runs
/// through exactly the same pipeline (batching, verdicts, acknowledgements, dead letters,
/// metrics), so embedding code can use the pipeline without a sandbox, and the benchmark
/// (`host/examples/pipeline_bench.rs`) can measure what the sandbox alone costs.
pub trait NativeHandler: Send + Sync {
    /// A short name for logs, metrics labels and `GET /pipelines` (e.g. `accept-all`).
    fn name(&self) -> &str;
    /// Judges one batch: exactly one verdict per record, in record order (any other count
    /// counts as a `wrong_verdict_count` fault and the batch gets the fault policy).
    fn handle(&self, records: &[Record]) -> Vec<Verdict>;
}

/// What a batch whose call faults gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnFault {
    /// It is split to find its poison records ([`Plugin::handle_isolating`]); the others keep
    /// the verdicts the plugin gave them.
    Isolate,
    /// The whole batch gets the fault policy and the fault is returned: a canary's batch, which
    /// the active version judges again (isolating would have the candidate judge parts of it
    /// once more on fresh instances).
    WholeBatch,
}

/// What judges a batch: a sandboxed plugin instance, or a trusted native handler.
pub(super) enum Handler {
    Wasm(Box<Plugin>),
    Native(Arc<dyn NativeHandler>),
}

impl Handler {
    /// Verdicts and emits for `records` plus the faults met, and the handler back (`None`
    /// when its instance was lost: the runtime shut down mid-call). A plugin runs on the
    /// runtime's guest threads; `on_fault` says what a faulted batch gets; `traceparent` is the
    /// trace context its outbound requests carry (when the host traces the batch).
    pub(super) async fn judge(
        self,
        records: Arc<[Record]>,
        policy: &Verdict,
        on_fault: OnFault,
        traceparent: Option<&str>,
    ) -> (Option<Handler>, Judged) {
        let n = records.len();
        match self {
            Handler::Wasm(mut plugin) => {
                plugin.set_traceparent(traceparent);
                let owned = policy.clone();
                let done = plugin
                    .on_guest_threads(move |p| {
                        Box::pin(async move {
                            if on_fault == OnFault::Isolate {
                                return p
                                    .handle_isolating(&records, &owned, MAX_ISOLATION_CALLS)
                                    .await;
                            }
                            match p.handle(&records).await {
                                BatchOutcome::Verdicts(verdicts) => Judged {
                                    verdicts,
                                    emits: p.take_emits(),
                                    ..Judged::default()
                                },
                                BatchOutcome::Fault(fault) => judged_by_policy(n, &owned, fault),
                            }
                        })
                    })
                    .await;
                match done {
                    Some((plugin, judged)) => (Some(Handler::Wasm(plugin)), judged),
                    None => {
                        let fault = Fault {
                            kind: FaultKind::Trap,
                            message: "the plugin runtime shut down during the call".into(),
                            records: n,
                        };
                        (None, judged_by_policy(n, policy, fault))
                    }
                }
            }
            Handler::Native(h) => {
                let verdicts = h.handle(&records);
                let judged = if verdicts.len() == n {
                    Judged {
                        verdicts,
                        ..Judged::default()
                    }
                } else {
                    let fault = Fault {
                        kind: FaultKind::WrongVerdictCount,
                        message: format!(
                            "native handler {} returned {} verdicts for {n} records",
                            h.name(),
                            verdicts.len(),
                        ),
                        records: n,
                    };
                    judged_by_policy(n, policy, fault)
                };
                (Some(Handler::Native(h)), judged)
            }
        }
    }
}

/// Every record of a batch of `n` gets the fault policy, for `fault`.
pub(super) fn judged_by_policy(n: usize, policy: &Verdict, fault: Fault) -> Judged {
    Judged {
        verdicts: vec![fault.verdict_under(policy); n],
        emits: Vec::new(),
        faults: vec![fault],
        faulted: (0..n).map(|i| (i, 0)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// Accepts every record, or answers one verdict short when told to.
    struct Native {
        short: bool,
    }

    impl NativeHandler for Native {
        fn name(&self) -> &str {
            "test"
        }

        fn handle(&self, records: &[Record]) -> Vec<Verdict> {
            let n = records.len() - usize::from(self.short);
            vec![Verdict::Accept; n]
        }
    }

    fn records(n: i64) -> Vec<Record> {
        (0..n)
            .map(|offset| Record {
                topic: Arc::from("t"),
                partition: 0,
                offset,
                timestamp: 0,
                delivery_count: 1,
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: Vec::new(),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_native_handler_judges_like_a_plugin_and_a_wrong_count_is_a_fault() {
        let batch: Arc<[Record]> = records(3).into();
        let good = Handler::Native(Arc::new(Native { short: false }));
        let (back, judged) = good
            .judge(batch.clone(), &Verdict::Release, OnFault::Isolate, None)
            .await;
        assert!(back.is_some(), "the handler comes back");
        let Judged {
            verdicts, faults, ..
        } = judged;
        assert_eq!(verdicts, vec![Verdict::Accept; 3]);
        assert!(faults.is_empty());

        let bad = Handler::Native(Arc::new(Native { short: true }));
        let Judged {
            verdicts, faults, ..
        } = bad
            .judge(batch, &Verdict::Release, OnFault::Isolate, None)
            .await
            .1;
        assert_eq!(
            verdicts,
            vec![Verdict::Release; 3],
            "the whole batch gets the fault policy"
        );
        assert_eq!(faults.len(), 1);
        assert_eq!(faults[0].kind, FaultKind::WrongVerdictCount);
        assert!(faults[0].message.contains("2 verdicts for 3 records"));
    }
}
