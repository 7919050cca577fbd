//! Fixed-capacity request bookkeeping shared by the transports: [`SlotTable`] for every comm
//! (verbs indexes it by sequence number), [`Slots`] on top for the byte-stream transports,
//! whose requests complete in posting order. Everything is allocated once when the comm is
//! made: the data path does no allocation per message.

use crate::{RequestId, Result, TransportError};
use std::collections::VecDeque;

/// One request's state.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SlotState<T> {
    Free,
    Pending(T),
    Done(usize),
}

/// Request ids as indices into a table allocated once, each recycled after its completion
/// was reported: what every comm keeps, whatever order its requests complete in.
#[derive(Debug)]
pub(crate) struct SlotTable<T> {
    slots: Vec<SlotState<T>>,
    peer: u32,
}

impl<T> SlotTable<T> {
    pub(crate) fn new(capacity: usize, peer: u32) -> Self {
        let mut slots = Vec::with_capacity(capacity);
        slots.resize_with(capacity, || SlotState::Free);
        SlotTable { slots, peer }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Takes slot `i` for `state`, unless its previous occupant is still unreported.
    pub(crate) fn claim(&mut self, i: usize, state: T) -> Result<RequestId> {
        if !matches!(self.slots[i], SlotState::Free) {
            return Err(self.full());
        }
        self.slots[i] = SlotState::Pending(state);
        Ok(RequestId(i as u32))
    }

    /// The error of a comm with every slot taken.
    pub(crate) fn full(&self) -> TransportError {
        TransportError::TooManyRequests {
            peer: self.peer,
            max: self.slots.len(),
        }
    }

    pub(crate) fn state(&self, i: usize) -> &SlotState<T> {
        &self.slots[i]
    }

    pub(crate) fn state_mut(&mut self, i: usize) -> &mut SlotState<T> {
        &mut self.slots[i]
    }

    /// The pending requests' states.
    pub(crate) fn pending(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| match s {
            SlotState::Pending(t) => Some(t),
            _ => None,
        })
    }

    /// Report completion of `id`, freeing the slot once the caller has seen it.
    pub(crate) fn take(&mut self, id: RequestId) -> Result<Option<usize>> {
        let slot = self
            .slots
            .get_mut(id.0 as usize)
            .ok_or(TransportError::UnknownRequest(id.0))?;
        match slot {
            SlotState::Free => Err(TransportError::UnknownRequest(id.0)),
            SlotState::Pending(_) => Ok(None),
            SlotState::Done(n) => {
                let n = *n;
                *slot = SlotState::Free;
                Ok(Some(n))
            }
        }
    }
}

/// A [`SlotTable`] whose requests complete in posting order (a byte stream is ordered), so
/// a FIFO of slot indices is enough to know which one the next bytes belong to.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    table: SlotTable<T>,
    /// Pending requests in posting order (front = oldest, the one being worked on).
    queue: VecDeque<u32>,
    free: Vec<u32>,
}

impl<T> Slots<T> {
    pub(crate) fn new(capacity: usize, peer: u32) -> Self {
        Slots {
            table: SlotTable::new(capacity, peer),
            queue: VecDeque::with_capacity(capacity),
            free: (0..capacity as u32).rev().collect(),
        }
    }

    pub(crate) fn post(&mut self, state: T) -> Result<RequestId> {
        let id = self.free.pop().ok_or_else(|| self.table.full())?;
        let id = self.table.claim(id as usize, state)?;
        self.queue.push_back(id.0);
        Ok(id)
    }

    /// The oldest pending request, which is the only one that can make progress.
    pub(crate) fn front(&mut self) -> Option<&mut T> {
        let id = *self.queue.front()?;
        match self.table.state_mut(id as usize) {
            SlotState::Pending(t) => Some(t),
            _ => None,
        }
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Mark the oldest pending request complete with `bytes`.
    pub(crate) fn complete_front(&mut self, bytes: usize) {
        if let Some(id) = self.queue.pop_front() {
            *self.table.state_mut(id as usize) = SlotState::Done(bytes);
        }
    }

    /// Report completion of `id`, freeing the slot once the caller has seen it.
    pub(crate) fn take(&mut self, id: RequestId) -> Result<Option<usize>> {
        let n = self.table.take(id)?;
        if n.is_some() {
            self.free.push(id.0);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_completion_and_reuse() {
        let mut s: Slots<u8> = Slots::new(2, 7);
        let a = s.post(1).unwrap();
        let b = s.post(2).unwrap();
        assert!(matches!(
            s.post(3),
            Err(TransportError::TooManyRequests { peer: 7, max: 2 })
        ));
        assert_eq!(s.front().copied(), Some(1));
        assert_eq!(s.take(a).unwrap(), None);
        s.complete_front(10);
        assert_eq!(s.front().copied(), Some(2));
        assert_eq!(s.take(a).unwrap(), Some(10));
        assert!(s.take(a).is_err(), "a slot is reported complete once");
        let c = s.post(4).unwrap();
        assert_eq!(c, a, "freed slot is reused");
        s.complete_front(20);
        assert_eq!(s.take(b).unwrap(), Some(20));
        assert!(s.has_pending());
    }
}
