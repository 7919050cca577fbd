//! Where both ends keep their requests: one slot per message in flight, found from its
//! sequence number alone.

use crate::slots::{SlotState as Slot, SlotTable};
use crate::{RequestId, Result, TransportError};
use std::time::{Duration, Instant};

/// The request ring both ends keep: a [`SlotTable`] indexed by sequence number modulo the
/// depth, so the id of message `seq` is known without a lookup.
pub(super) struct Ring<T> {
    table: SlotTable<T>,
}

impl<T: Copy> Ring<T> {
    pub(super) fn new(depth: usize, peer: u32) -> Self {
        assert!(
            depth.is_power_of_two(),
            "verbs: depth must be a power of two"
        );
        Ring {
            table: SlotTable::new(depth, peer),
        }
    }

    pub(super) fn index(&self, seq: u64) -> usize {
        (seq as usize) & (self.table.len() - 1)
    }

    pub(super) fn get(&self, i: usize) -> Slot<T> {
        *self.table.state(i)
    }

    pub(super) fn set(&mut self, i: usize, s: Slot<T>) {
        *self.table.state_mut(i) = s;
    }

    /// Takes the slot of message `seq` for `t`, unless its previous occupant is unreported.
    pub(super) fn claim(&mut self, seq: u64, t: T) -> Result<RequestId> {
        self.table.claim(self.index(seq), t)
    }

    /// `Some(bytes)` once `id` is complete; the id is free again afterwards.
    pub(super) fn take(&mut self, id: RequestId) -> Result<Option<usize>> {
        self.table.take(id)
    }

    /// Fails when an active request has waited longer than `timeout` for its next step;
    /// `describe` gives its start and what it waits for.
    pub(super) fn check_stall(
        &self,
        now: Instant,
        timeout: Duration,
        describe: impl Fn(&T) -> (Instant, String),
    ) -> Result<()> {
        for t in self.table.pending() {
            let (since, what) = describe(t);
            if now.duration_since(since) > timeout {
                return Err(TransportError::Timeout {
                    secs: timeout.as_secs_f64(),
                    what,
                });
            }
        }
        Ok(())
    }
}
