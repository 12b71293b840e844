//! Share-group membership (ShareGroupHeartbeat v1) as a pure state machine: what the next
//! heartbeat says and what a response means. The heartbeat loop only sends, waits and feeds back.
//!
//! Behaviour follows the Java share consumer (KIP-932 reference §3, §4.1): a client-generated
//! member id kept for the consumer's life, epoch 0 joins (and rejoins after fencing, with the same
//! id), -1 leaves, a full request (with the subscription) after any error, and the assignment
//! replaced wholesale when the coordinator sends one.

use std::collections::BTreeSet;
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    GroupId, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::ledger::TopicIdPartition;

/// Where the member stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberState {
    /// Next heartbeat joins (epoch 0).
    Joining,
    /// In the group at the current epoch.
    Stable,
    /// Next heartbeat leaves (epoch -1).
    Leaving,
    /// Out of the group; no more heartbeats.
    Left,
    /// An error retrying cannot fix; the consumer must stop and report it.
    Fatal(String),
}

/// What the heartbeat loop should do after a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatAction {
    /// Heartbeat again after this interval.
    Wait(Duration),
    /// Heartbeat again right away (rejoin after fencing).
    Now,
    /// Back off, then heartbeat again (coordinator loading, transport error).
    Backoff,
    /// Find the coordinator again, then heartbeat.
    RefindCoordinator,
    /// Stop heartbeating: left the group, or a fatal error.
    Stop,
}

/// How soon a member that has joined but holds no partitions yet heartbeats again. The
/// coordinator answers the joining heartbeat before it has an assignment for the member (it
/// initialises share-partition state and computes assignments asynchronously, at most every
/// `group.share.assignment.interval.ms`, 1 s by default on Kafka 4.3+); the assignment then
/// only reaches the member with its next heartbeat. At the broker's 5 s interval that is 5 s
/// from start to the first record; heartbeating again sooner while unassigned brings it down
/// to the broker's assignment interval: 5.05 s to 1.07 s measured against Kafka 4.4.0 with
/// default settings (the assignment arrived 1.04 s after the pipeline started; a 100 ms early
/// interval measured the same, so the broker's interval is the floor).
const EARLY_HEARTBEAT: Duration = Duration::from_millis(200);
/// Early heartbeats after a join, at most (8 s at [`EARLY_HEARTBEAT`]): a member that stays
/// unassigned (more members than partitions) then falls back to the broker's interval.
const EARLY_HEARTBEATS: u32 = 40;

/// Membership state of one consumer.
#[derive(Debug, Clone)]
pub struct Membership {
    group: String,
    member_id: String,
    topics: Vec<String>,
    state: MemberState,
    epoch: i32,
    interval: Duration,
    full_next: bool,
    assignment: BTreeSet<TopicIdPartition>,
    assignment_epoch: u64,
    /// Early heartbeats left while the member holds no partition since it (re)joined.
    early_left: u32,
}

/// A new member id: share-group member ids are the client's to choose (22 random hex digits,
/// within the broker's limit of 36 characters).
pub fn fresh_member_id() -> String {
    uuid::Uuid::new_v4()
        .simple()
        .to_string()
        .chars()
        .take(22)
        .collect()
}

impl Membership {
    /// A member about to join `group` subscribed to `topics`, with a fresh member id.
    pub fn new(group: &str, topics: &[String]) -> Self {
        Self::with_member_id(group, topics, &fresh_member_id())
    }

    /// A member with a given id (one kept across restarts, or a test's; the broker wants
    /// 1..=36 characters).
    pub fn with_member_id(group: &str, topics: &[String], member_id: &str) -> Self {
        let mut topics = topics.to_vec();
        topics.sort();
        topics.dedup();
        Membership {
            group: group.to_owned(),
            member_id: member_id.to_owned(),
            topics,
            state: MemberState::Joining,
            epoch: 0,
            interval: Duration::from_secs(5),
            full_next: true,
            assignment: BTreeSet::new(),
            assignment_epoch: 0,
            early_left: EARLY_HEARTBEATS,
        }
    }

    /// The member id (also sent in every ShareFetch and ShareAcknowledge).
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The group id.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Current state.
    pub fn state(&self) -> &MemberState {
        &self.state
    }

    /// Current member epoch.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// The partitions the coordinator assigned (topic ids; may be shared with other members).
    pub fn assignment(&self) -> &BTreeSet<TopicIdPartition> {
        &self.assignment
    }

    /// Bumped whenever the assignment changes, so the fetch side can notice cheaply.
    pub fn assignment_epoch(&self) -> u64 {
        self.assignment_epoch
    }

    /// Changes the subscription; the next heartbeat carries it.
    pub fn subscribe(&mut self, topics: &[String]) {
        let mut t = topics.to_vec();
        t.sort();
        t.dedup();
        if t != self.topics {
            self.topics = t;
            self.full_next = true;
        }
    }

    /// Asks to leave: the next heartbeat carries epoch -1.
    pub fn leave(&mut self) {
        match self.state {
            MemberState::Left | MemberState::Fatal(_) => {}
            // Never joined: nothing to leave.
            MemberState::Joining if self.epoch == 0 => self.state = MemberState::Left,
            _ => self.state = MemberState::Leaving,
        }
    }

    /// The next heartbeat, or `None` when no heartbeat should be sent.
    pub fn heartbeat(&self) -> Option<ShareGroupHeartbeatRequest> {
        let epoch = match self.state {
            MemberState::Joining => 0,
            MemberState::Stable => self.epoch,
            MemberState::Leaving => -1,
            MemberState::Left | MemberState::Fatal(_) => return None,
        };
        let full = self.full_next || epoch == 0;
        Some(
            ShareGroupHeartbeatRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_member_epoch(epoch)
                .with_rack_id(None)
                .with_subscribed_topic_names(if full && epoch != -1 {
                    Some(
                        self.topics
                            .iter()
                            .map(|t| TopicName(StrBytes::from_string(t.clone())))
                            .collect(),
                    )
                } else {
                    None
                }),
        )
    }

    fn set_assignment(&mut self, new: BTreeSet<TopicIdPartition>) {
        if new != self.assignment {
            self.assignment = new;
            self.assignment_epoch += 1;
        }
    }

    /// Feeds back a heartbeat response.
    pub fn on_response(&mut self, resp: &ShareGroupHeartbeatResponse) -> HeartbeatAction {
        let leaving = self.state == MemberState::Leaving;
        let Some(err) = ResponseError::try_from_code(resp.error_code) else {
            self.full_next = false;
            if resp.heartbeat_interval_ms > 0 {
                self.interval = Duration::from_millis(resp.heartbeat_interval_ms as u64);
            }
            if leaving || resp.member_epoch < 0 {
                self.state = MemberState::Left;
                self.epoch = -1;
                self.set_assignment(BTreeSet::new());
                return HeartbeatAction::Stop;
            }
            self.epoch = resp.member_epoch;
            self.state = MemberState::Stable;
            if let Some(a) = &resp.assignment {
                let new = a
                    .topic_partitions
                    .iter()
                    .flat_map(|t| {
                        t.partitions.iter().map(|p| TopicIdPartition {
                            topic_id: t.topic_id,
                            partition: *p,
                        })
                    })
                    .collect();
                self.set_assignment(new);
            }
            if !self.assignment.is_empty() {
                // Assigned: the broker's cadence from now on, also if partitions move away.
                self.early_left = 0;
            } else if self.early_left > 0 {
                self.early_left -= 1;
                return HeartbeatAction::Wait(self.interval.min(EARLY_HEARTBEAT));
            }
            return HeartbeatAction::Wait(self.interval);
        };
        // After any error the next heartbeat is a full one.
        self.full_next = true;
        let message = resp.error_message.as_deref().unwrap_or("").to_owned();
        match err {
            ResponseError::UnknownMemberId | ResponseError::FencedMemberEpoch => {
                if leaving {
                    self.state = MemberState::Left;
                    return HeartbeatAction::Stop;
                }
                // Fenced: drop the assignment and rejoin at once with the same member id.
                self.state = MemberState::Joining;
                self.epoch = 0;
                self.early_left = EARLY_HEARTBEATS;
                self.set_assignment(BTreeSet::new());
                HeartbeatAction::Now
            }
            ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable => {
                HeartbeatAction::RefindCoordinator
            }
            ResponseError::CoordinatorLoadInProgress => HeartbeatAction::Backoff,
            ResponseError::GroupIdNotFound if leaving => {
                self.state = MemberState::Left;
                HeartbeatAction::Stop
            }
            ResponseError::UnsupportedVersion => {
                self.fatal(format!(
                    "share groups are not enabled on this cluster (feature share.version is 0; enable it with \
                     kafka-features upgrade --feature share.version=1){}",
                    if message.is_empty() { String::new() } else { format!(": {message}") }
                ));
                HeartbeatAction::Stop
            }
            other => {
                self.fatal(format!(
                    "group {}: heartbeat failed with {other:?} ({}){}",
                    self.group,
                    other.code(),
                    if message.is_empty() {
                        String::new()
                    } else {
                        format!(": {message}")
                    }
                ));
                HeartbeatAction::Stop
            }
        }
    }

    /// Feeds back a heartbeat that got no response (connection lost, timeout).
    pub fn on_transport_error(&mut self) -> HeartbeatAction {
        self.full_next = true;
        if self.state == MemberState::Leaving {
            // Leaving without an answer: the session timeout removes us anyway.
            self.state = MemberState::Left;
            return HeartbeatAction::Stop;
        }
        HeartbeatAction::RefindCoordinator
    }

    fn fatal(&mut self, why: String) {
        self.state = MemberState::Fatal(why);
        self.set_assignment(BTreeSet::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
    use uuid::Uuid;

    fn member() -> Membership {
        Membership::with_member_id("g", &["b".into(), "a".into(), "a".into()], "member-1")
    }

    fn ok(epoch: i32, assignment: Option<Vec<(u128, Vec<i32>)>>) -> ShareGroupHeartbeatResponse {
        ShareGroupHeartbeatResponse::default()
            .with_member_epoch(epoch)
            .with_heartbeat_interval_ms(1000)
            .with_assignment(assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(t, p)| {
                            TopicPartitions::default()
                                .with_topic_id(Uuid::from_u128(t))
                                .with_partitions(p)
                        })
                        .collect(),
                )
            }))
    }

    fn err(e: ResponseError) -> ShareGroupHeartbeatResponse {
        ShareGroupHeartbeatResponse::default()
            .with_error_code(e.code())
            .with_member_epoch(-1)
    }

    #[test]
    fn join_sends_epoch_zero_with_the_sorted_subscription_and_no_rack() {
        let m = member();
        let hb = m.heartbeat().expect("joining heartbeats");
        assert_eq!(hb.member_epoch, 0);
        assert_eq!(hb.member_id.as_str(), "member-1");
        assert!(hb.rack_id.is_none(), "RackId must be null, never empty");
        let topics: Vec<&str> = hb
            .subscribed_topic_names
            .as_ref()
            .expect("full")
            .iter()
            .map(|t| t.0.as_str())
            .collect();
        assert_eq!(topics, vec!["a", "b"]);
    }

    #[test]
    fn generated_member_ids_fit_the_broker_limit() {
        let m = Membership::new("g", &["t".into()]);
        assert!(!m.member_id().is_empty() && m.member_id().len() <= 36);
        assert_ne!(
            m.member_id(),
            Membership::new("g", &["t".into()]).member_id()
        );
    }

    #[test]
    fn an_empty_first_assignment_is_not_the_end() {
        let mut m = member();
        // Joined without partitions yet: heartbeat again soon, for the assignment.
        assert_eq!(
            m.on_response(&ok(1, Some(vec![]))),
            HeartbeatAction::Wait(EARLY_HEARTBEAT)
        );
        assert_eq!(m.state(), &MemberState::Stable);
        assert!(m.assignment().is_empty());
        let hb = m.heartbeat().expect("stable heartbeats");
        assert_eq!(hb.member_epoch, 1);
        assert!(hb.subscribed_topic_names.is_none(), "not full once stable");
        assert_eq!(
            m.on_response(&ok(2, Some(vec![(7, vec![0, 1])]))),
            HeartbeatAction::Wait(Duration::from_secs(1)),
            "assigned: the broker's interval"
        );
        assert_eq!(m.assignment().len(), 2);
        let e = m.assignment_epoch();
        m.on_response(&ok(2, None));
        assert_eq!(m.assignment().len(), 2, "null assignment means unchanged");
        assert_eq!(m.assignment_epoch(), e);
        // Partitions moved away later: no early heartbeats, the broker's cadence stays.
        assert_eq!(
            m.on_response(&ok(3, Some(vec![]))),
            HeartbeatAction::Wait(Duration::from_secs(1))
        );
    }

    #[test]
    fn a_member_that_stays_unassigned_falls_back_to_the_brokers_interval() {
        let mut m = member();
        for _ in 0..EARLY_HEARTBEATS {
            assert_eq!(
                m.on_response(&ok(1, Some(vec![]))),
                HeartbeatAction::Wait(EARLY_HEARTBEAT)
            );
        }
        assert_eq!(
            m.on_response(&ok(1, Some(vec![]))),
            HeartbeatAction::Wait(Duration::from_secs(1))
        );
    }

    #[test]
    fn fencing_rejoins_at_once_with_the_same_id_and_drops_the_assignment() {
        for e in [
            ResponseError::UnknownMemberId,
            ResponseError::FencedMemberEpoch,
        ] {
            let mut m = member();
            m.on_response(&ok(3, Some(vec![(7, vec![0])])));
            assert_eq!(m.on_response(&err(e)), HeartbeatAction::Now, "{e:?}");
            assert!(m.assignment().is_empty());
            let hb = m.heartbeat().expect("rejoin");
            assert_eq!(hb.member_epoch, 0);
            assert_eq!(hb.member_id.as_str(), "member-1");
            assert!(hb.subscribed_topic_names.is_some());
        }
    }

    #[test]
    fn coordinator_errors_refind_or_back_off_and_make_the_next_heartbeat_full() {
        let mut m = member();
        m.on_response(&ok(1, Some(vec![])));
        assert_eq!(
            m.on_response(&err(ResponseError::NotCoordinator)),
            HeartbeatAction::RefindCoordinator
        );
        assert!(m.heartbeat().expect("hb").subscribed_topic_names.is_some());
        assert_eq!(
            m.on_response(&err(ResponseError::CoordinatorNotAvailable)),
            HeartbeatAction::RefindCoordinator
        );
        assert_eq!(
            m.on_response(&err(ResponseError::CoordinatorLoadInProgress)),
            HeartbeatAction::Backoff
        );
        assert_eq!(m.state(), &MemberState::Stable, "still a member");
        assert_eq!(m.on_transport_error(), HeartbeatAction::RefindCoordinator);
    }

    #[test]
    fn fatal_errors_stop_with_the_broker_message() {
        for e in [
            ResponseError::GroupAuthorizationFailed,
            ResponseError::TopicAuthorizationFailed,
            ResponseError::GroupMaxSizeReached,
            ResponseError::InvalidRequest,
            ResponseError::GroupIdNotFound,
            ResponseError::UnsupportedVersion,
        ] {
            let mut m = member();
            let resp = err(e).with_error_message(Some(StrBytes::from_static_str("because")));
            assert_eq!(m.on_response(&resp), HeartbeatAction::Stop, "{e:?}");
            match m.state() {
                MemberState::Fatal(why) => assert!(why.contains("because"), "{why}"),
                other => panic!("{e:?}: {other:?}"),
            }
            assert!(m.heartbeat().is_none());
        }
    }

    #[test]
    fn leaving_sends_minus_one_and_ends_even_on_errors() {
        let mut m = member();
        m.on_response(&ok(4, Some(vec![(1, vec![0])])));
        m.leave();
        let hb = m.heartbeat().expect("leave heartbeat");
        assert_eq!(hb.member_epoch, -1);
        assert_eq!(m.on_response(&ok(-1, None)), HeartbeatAction::Stop);
        assert_eq!(m.state(), &MemberState::Left);
        assert!(m.assignment().is_empty());

        let mut m = member();
        m.on_response(&ok(4, None));
        m.leave();
        assert_eq!(
            m.on_response(&err(ResponseError::GroupIdNotFound)),
            HeartbeatAction::Stop
        );
        assert_eq!(m.state(), &MemberState::Left);

        let mut never_joined = member();
        never_joined.leave();
        assert!(never_joined.heartbeat().is_none(), "nothing to leave");
    }

    #[test]
    fn subscription_changes_make_the_next_heartbeat_full() {
        let mut m = member();
        m.on_response(&ok(1, None));
        m.subscribe(&["a".into(), "b".into()]);
        assert!(
            m.heartbeat().expect("hb").subscribed_topic_names.is_none(),
            "same set: no change"
        );
        m.subscribe(&["c".into()]);
        let names = m
            .heartbeat()
            .expect("hb")
            .subscribed_topic_names
            .expect("full");
        assert_eq!(names.len(), 1);
    }
}
