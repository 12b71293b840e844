//! What `sharehost fleet` does for an operator: reads the fleet's state as the hosts do,
//! uploads a component once per digest, and records a signed action with the next number of
//! the pipeline's history. An action the fleet's state would refuse (a promote with no canary,
//! a rollback to a version never run) is refused here, before anything is written.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::agent::{FleetView, Folded, fold_record, view};
use super::components;
use super::desired::{self, FleetState};
use super::hosts::Hosts;
use super::records::{Action, Change, ComponentRef, action_key, decode_status};
use super::sign::{self, SignError};
use super::topics::{self, TopicError, Topics};
use crate::kafka::now_ms;
use crate::kafka::{Compression, KafkaClient, KafkaError, OffsetSpec, ProduceRecord};
use crate::manifest::{FleetSpec, Manifest, PipelineSpec};
use crate::runtime::{TrustPolicy, signature_path};

/// Why an operator's action was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The manifest has no `[fleet]`.
    #[error("{0}: no [fleet] table: fleet commands work on a manifest of a fleet's host")]
    NotAFleet(PathBuf),
    /// The fleet's topics cannot be made or used.
    #[error(transparent)]
    Topics(#[from] TopicError),
    /// The cluster failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The manifest has no such pipeline.
    #[error("--pipeline {pipeline}: the manifest has no such pipeline (it has: {known})")]
    UnknownPipeline {
        /// The name given.
        pipeline: String,
        /// The names it has.
        known: String,
    },
    /// The component cannot be deployed.
    #[error("{path}: {reason}")]
    Component {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The action cannot be signed.
    #[error(transparent)]
    Sign(#[from] SignError),
    /// The fleet's state refuses the action.
    #[error("pipeline {pipeline}: {reason}")]
    Refused {
        /// The pipeline.
        pipeline: String,
        /// Why.
        reason: String,
    },
}

/// An operator's handle on a fleet: its state as read when opened.
pub struct Operator {
    spec: FleetSpec,
    client: Arc<KafkaClient>,
    topics: Topics,
    state: FleetState,
    hosts: Hosts,
    last_refused: Option<String>,
}

/// Reads a one-partition topic from its start to its end, handing each record to `f`.
async fn read_all(
    client: &KafkaClient,
    topic: &str,
    mut f: impl FnMut(crate::kafka::ConsumedRecord),
) -> Result<(), KafkaError> {
    let mut at = client.list_offset(topic, 0, OffsetSpec::Earliest).await?;
    let end = client.list_offset(topic, 0, OffsetSpec::Latest).await?;
    while at < end {
        let got = client.fetch(topic, 0, at, Duration::ZERO).await?;
        let Some(last) = got.records.last().map(|r| r.offset) else {
            break;
        };
        for r in got.records {
            if r.offset >= at {
                f(r);
            }
        }
        at = last + 1;
    }
    Ok(())
}

impl Operator {
    /// Opens the fleet of `manifest` (its topics made or checked) and reads its state.
    pub async fn open(
        manifest: &Manifest,
        client: Arc<KafkaClient>,
    ) -> Result<Operator, OperatorError> {
        let spec = manifest
            .fleet
            .clone()
            .ok_or_else(|| OperatorError::NotAFleet(manifest.path.clone()))?;
        let topics = topics::ensure(&client, &spec).await?;
        let mut state = FleetState::default();
        let mut last_refused = None;
        read_all(&client, &topics.deployments, |r| {
            // A record that panics its reader is skipped, as on the hosts.
            let folded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fold_record(&mut state, &spec, &r)
            }));
            match folded {
                Ok(Folded::Skipped { why, .. } | Folded::Refused(why)) => last_refused = Some(why),
                Err(_) => last_refused = Some(format!("reading record {} panicked", r.offset)),
                _ => {}
            }
        })
        .await?;
        let mut hosts = Hosts::new(spec.max_hosts, spec.stale_after_ms);
        let now = now_ms();
        read_all(&client, &topics.status, |r| {
            let decoded = std::panic::catch_unwind(|| decode_status(r.value.as_deref()));
            if let Ok(Ok(s)) = decoded
                && r.key.as_deref() == Some(s.host.as_bytes())
            {
                let _ = hosts.take(s, now);
            } else if r.value.is_none()
                && let Some(k) = r.key.as_deref()
            {
                hosts.remove(String::from_utf8_lossy(k).as_ref());
            }
        })
        .await?;
        Ok(Operator {
            spec,
            client,
            topics,
            state,
            hosts,
            last_refused,
        })
    }

    /// The fleet as read (`sharehost fleet status`).
    pub fn view(&self) -> FleetView {
        view(
            &self.spec,
            "(operator)",
            &self.state,
            &self.hosts,
            self.last_refused.clone(),
        )
    }

    /// The pipeline `name` of `manifest`, or an error listing the ones it has.
    pub fn pipeline<'m>(
        manifest: &'m Manifest,
        name: &str,
    ) -> Result<&'m PipelineSpec, OperatorError> {
        manifest
            .pipelines
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| OperatorError::UnknownPipeline {
                pipeline: name.to_owned(),
                known: manifest
                    .pipelines
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Checks `path`'s signature with the keys the pipeline's hosts will use, and uploads its
    /// bytes unless the fleet has them already; returns how an action names it.
    pub async fn component(
        &self,
        pipeline: &PipelineSpec,
        path: &Path,
    ) -> Result<ComponentRef, OperatorError> {
        let bad = |reason: String| OperatorError::Component {
            path: path.to_owned(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let sig_path = signature_path(path);
        let signature = std::fs::read_to_string(&sig_path).map_err(|e| {
            bad(format!(
                "its signature {} cannot be read ({e}): a fleet deploys signed components only",
                sig_path.display()
            ))
        })?;
        let trust: &TrustPolicy = pipeline.trust.as_deref().unwrap_or(&self.spec.trust);
        trust
            .verify_signed(&sig_path, &bytes, &signature)
            .map_err(|e| bad(e.to_string()))?;
        let digest = components::digest(&bytes);
        let known = self
            .state
            .pipelines
            .values()
            .flat_map(desired::components)
            .find(|c| c.digest == digest)
            .map(|c| c.chunks.clone());
        let chunks = match known {
            Some(chunks) => chunks,
            None => components::upload(&self.client, &self.topics.components, &digest, &bytes)
                .await
                .map_err(|e| bad(e.to_string()))?,
        };
        Ok(ComponentRef {
            digest,
            size: bytes.len() as u64,
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            signature,
            chunks,
        })
    }

    /// Records `change` of `pipeline` as its next action, signed with `key`. Refused, and
    /// nothing written, when the fleet's state would refuse it.
    pub async fn act(
        &self,
        pipeline: &str,
        change: Change,
        key: &minisign::SecretKey,
    ) -> Result<Action, OperatorError> {
        let mut action = Action {
            fleet: self.spec.name.clone(),
            pipeline: pipeline.to_owned(),
            seq: self.state.desired(pipeline).seq + 1,
            issued_at_ms: now_ms(),
            change,
            then: Default::default(),
        };
        let mut next = self.state.clone();
        next.apply_action(&action)
            .map_err(|e| OperatorError::Refused {
                pipeline: pipeline.to_owned(),
                reason: e.to_string(),
            })?;
        action.then = next.desired(pipeline);
        let signed = sign::sign(&action, key)?;
        let record = ProduceRecord {
            key: Some(Bytes::from(action_key(pipeline, action.seq))),
            value: Some(Bytes::from(
                serde_json::to_vec(&signed).map_err(|e| SignError::Sign(e.to_string()))?,
            )),
            headers: Vec::new(),
            timestamp: None,
        };
        self.client
            .produce(&self.topics.deployments, 0, &[record], Compression::None)
            .await?;
        Ok(action)
    }
}
