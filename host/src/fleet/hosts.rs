//! Every host's latest status as one reader (a host, or `sharehost fleet status`) keeps it
//! from the status topic. Anyone who can write that topic can write a status, so what is kept
//! is bounded and judged by the reader, never by the record: at most `fleet.max_hosts` hosts
//! (the oldest dropped), a time from the future taken as the reader's now (so it ages like any
//! other), and two writers under one host id (a forger, or two hosts given one
//! `fleet.host_id`) flagged on that host for everyone to see.

use std::collections::BTreeMap;

pub use sharehost_api::fleet::Conflict;

use super::records::HostStatus;

/// How many instances of one host id a reader remembers (a host restarted many times in a
/// row, or a forger making up instances, never grows the entry past this).
const INSTANCES_KEPT: usize = 8;

/// One host as the reader keeps it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its latest status (its `at_ms` no later than the reader's clock when read).
    pub status: HostStatus,
    /// The instances heard under its id lately, and the time of each one's latest status.
    instances: BTreeMap<String, u64>,
    /// Two writers seen under its id, when last.
    pub conflict: Option<Conflict>,
}

/// Something a status did that the reader counts (in `sharehost_fleet_records_skipped_total`
/// on the status topic, by `kind`) and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// A short name for the metric's reason label.
    pub kind: &'static str,
    /// The whole reason.
    pub why: String,
}

/// Every host's latest status, bounded (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Hosts {
    max: usize,
    stale_after_ms: u64,
    /// The reader's own host id, never dropped for the bound.
    own: Option<String>,
    entries: BTreeMap<String, Entry>,
}

impl Hosts {
    /// An empty book keeping at most `max` hosts; a writer silent for `stale_after_ms` no
    /// longer counts as live when another writes under its id.
    pub fn new(max: usize, stale_after_ms: u64) -> Hosts {
        Hosts {
            max: max.max(1),
            stale_after_ms,
            own: None,
            entries: BTreeMap::new(),
        }
    }

    /// The book of host `own`: its own status is never the one dropped for the bound (a flood
    /// of made-up hosts must not hide the reader from its own view).
    pub fn of_host(own: &str, max: usize, stale_after_ms: u64) -> Hosts {
        Hosts {
            own: Some(own.to_owned()),
            ..Hosts::new(max, stale_after_ms)
        }
    }

    /// Takes `s` as its host's latest status, read when the reader's clock said `now_ms`;
    /// returns what it counts.
    pub fn take(&mut self, mut s: HostStatus, now_ms: u64) -> Vec<Note> {
        let mut notes = Vec::new();
        if s.at_ms > now_ms {
            if s.at_ms - now_ms > self.stale_after_ms {
                notes.push(Note {
                    kind: "future_at_ms",
                    why: format!(
                        "host {:?} says its status was written {} ms from now: taken as written now, so it ages",
                        s.host,
                        s.at_ms - now_ms
                    ),
                });
            }
            s.at_ms = now_ms;
        }
        let at = s.at_ms;
        let stale_after = self.stale_after_ms;
        if let Some(e) = self.entries.get_mut(&s.host) {
            // Another instance wrote under this id since this one's last status, while this
            // one was still live: two writers take turns, which one host restarting never does
            // (its old instance falls silent).
            if let Some(&mine) = e.instances.get(&s.instance) {
                let other = e
                    .instances
                    .iter()
                    .find(|(i, t)| **i != s.instance && **t >= mine)
                    .map(|(i, _)| i.clone());
                if let Some(other) = other
                    && at.saturating_sub(mine) <= stale_after
                {
                    let reason = format!(
                        "two writers report as host {:?} (instances {} and {}): a status under another host's id, or two hosts with one fleet.host_id",
                        s.host, s.instance, other
                    );
                    notes.push(Note {
                        kind: "clashing_writers",
                        why: reason.clone(),
                    });
                    e.conflict = Some(Conflict {
                        reason,
                        at_ms: now_ms,
                    });
                }
            }
            e.instances.insert(s.instance.clone(), at);
            while e.instances.len() > INSTANCES_KEPT {
                let oldest = e
                    .instances
                    .iter()
                    .min_by_key(|(_, t)| **t)
                    .map(|(i, _)| i.clone());
                if let Some(i) = oldest {
                    e.instances.remove(&i);
                }
            }
            e.status = s;
            return notes;
        }
        let host = s.host.clone();
        self.entries.insert(
            host,
            Entry {
                instances: BTreeMap::from([(s.instance.clone(), at)]),
                status: s,
                conflict: None,
            },
        );
        if self.entries.len() > self.max {
            let oldest = self
                .entries
                .iter()
                .filter(|(h, _)| self.own.as_ref() != Some(*h))
                .min_by_key(|(h, e)| (e.status.at_ms, (*h).clone()))
                .map(|(h, _)| h.clone());
            if let Some(h) = oldest {
                self.entries.remove(&h);
                notes.push(Note {
                    kind: "host_limit",
                    why: format!(
                        "more than fleet.max_hosts = {} hosts in the status topic: the one heard from longest ago ({h:?}) is dropped",
                        self.max
                    ),
                });
            }
        }
        notes
    }

    /// Flags `host` as written by two writers (seen by the host itself: another live process
    /// reports under its id), keeping the status it has.
    pub fn flag(&mut self, host: &str, reason: String, now_ms: u64) {
        if let Some(e) = self.entries.get_mut(host) {
            e.conflict = Some(Conflict {
                reason,
                at_ms: now_ms,
            });
        }
    }

    /// Forgets `host` (a tombstone: it left for good).
    pub fn remove(&mut self, host: &str) {
        self.entries.remove(host);
    }

    /// The latest status of `host`.
    pub fn get(&self, host: &str) -> Option<&HostStatus> {
        self.entries.get(host).map(|e| &e.status)
    }

    /// How many hosts are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No host kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every host kept, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }

    /// Every host's latest status, by id.
    pub fn statuses(&self) -> impl Iterator<Item = (&String, &HostStatus)> {
        self.entries.iter().map(|(h, e)| (h, &e.status))
    }

    /// The conflict of an entry, while it is recent (two writers seen within the stale time
    /// before `now_ms`).
    pub fn live_conflict(&self, e: &Entry, now_ms: u64) -> Option<Conflict> {
        e.conflict
            .clone()
            .filter(|c| now_ms.saturating_sub(c.at_ms) <= self.stale_after_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(host: &str, instance: &str, at_ms: u64) -> HostStatus {
        HostStatus {
            host: host.into(),
            instance: instance.into(),
            at_ms,
            version: "0".into(),
            pipelines: Vec::new(),
        }
    }

    fn kinds(notes: &[Note]) -> Vec<&'static str> {
        notes.iter().map(|n| n.kind).collect()
    }

    #[test]
    fn at_most_max_hosts_are_kept_and_the_oldest_is_dropped() {
        let mut book = Hosts::new(3, 10_000);
        for (i, h) in ["a", "b", "c"].iter().enumerate() {
            assert!(book.take(status(h, h, 100 + i as u64), 1_000).is_empty());
        }
        let notes = book.take(status("d", "d", 500), 1_000);
        assert_eq!(kinds(&notes), ["host_limit"], "{notes:?}");
        assert!(notes[0].why.contains("fleet.max_hosts = 3"), "{notes:?}");
        assert_eq!(book.len(), 3);
        assert!(book.get("a").is_none(), "the oldest dropped");
        // 50,000 forged hosts never grow it past the bound.
        for i in 0..50_000u64 {
            book.take(status(&format!("forged-{i}"), "x", 600 + i), 100_000);
        }
        assert_eq!(book.len(), 3);
        // A host's own status is never the one dropped.
        let mut own = Hosts::of_host("me", 2, 10_000);
        own.take(status("me", "i", 1), 1_000);
        own.take(status("x", "x", 500), 1_000);
        own.take(status("y", "y", 600), 1_000);
        assert!(own.get("me").is_some() && own.get("y").is_some() && own.len() == 2);
    }

    #[test]
    fn a_status_from_the_future_is_taken_as_written_now_and_ages() {
        let mut book = Hosts::new(10, 10_000);
        let notes = book.take(status("a", "i", u64::MAX), 1_000);
        assert_eq!(kinds(&notes), ["future_at_ms"]);
        assert_eq!(book.get("a").map(|s| s.at_ms), Some(1_000));
        // A clock a little ahead is clamped without a note.
        assert!(book.take(status("b", "i", 1_500), 1_000).is_empty());
        assert_eq!(book.get("b").map(|s| s.at_ms), Some(1_000));
    }

    #[test]
    fn two_writers_under_one_id_are_flagged_and_a_restart_is_not() {
        let mut book = Hosts::new(10, 10_000);
        // A restart: the old instance falls silent, the new one takes over.
        book.take(status("a", "old", 1_000), 1_000);
        assert!(book.take(status("a", "new", 2_000), 2_000).is_empty());
        assert!(book.take(status("a", "new", 3_000), 3_000).is_empty());
        let e = book.iter().next().map(|(_, e)| e.clone()).expect("a");
        assert_eq!(book.live_conflict(&e, 3_000), None);
        // A forger's status under a's id, then a's own next one: flagged.
        assert!(book.take(status("a", "forged", 3_500), 3_500).is_empty());
        let notes = book.take(status("a", "new", 4_000), 4_000);
        assert_eq!(kinds(&notes), ["clashing_writers"], "{notes:?}");
        let e = book.iter().next().map(|(_, e)| e.clone()).expect("a");
        assert!(book.live_conflict(&e, 4_000).is_some());
        // Forgotten once the writers stop taking turns for the stale time.
        assert_eq!(book.live_conflict(&e, 20_000), None);
    }
}
