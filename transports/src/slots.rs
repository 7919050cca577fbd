//! Fixed-capacity request bookkeeping shared by the transports.
//!
//! Requests complete in posting order on a comm (a byte stream is ordered), so a FIFO of slot
//! indices is enough. Everything is allocated once when the comm is made: the data path does
//! no allocation per message.

use crate::{RequestId, Result, TransportError};
use std::collections::VecDeque;

#[derive(Debug)]
pub(crate) enum SlotState<T> {
    Free,
    Pending(T),
    Done(usize),
}

#[derive(Debug)]
pub(crate) struct Slots<T> {
    slots: Vec<SlotState<T>>,
    /// Pending requests in posting order (front = oldest, the one being worked on).
    queue: VecDeque<u32>,
    free: Vec<u32>,
    peer: u32,
}

impl<T> Slots<T> {
    pub(crate) fn new(capacity: usize, peer: u32) -> Self {
        let mut slots = Vec::with_capacity(capacity);
        slots.resize_with(capacity, || SlotState::Free);
        Slots {
            slots,
            queue: VecDeque::with_capacity(capacity),
            free: (0..capacity as u32).rev().collect(),
            peer,
        }
    }

    pub(crate) fn post(&mut self, state: T) -> Result<RequestId> {
        let id = self.free.pop().ok_or(TransportError::TooManyRequests {
            peer: self.peer,
            max: self.slots.len(),
        })?;
        self.slots[id as usize] = SlotState::Pending(state);
        self.queue.push_back(id);
        Ok(RequestId(id))
    }

    /// The oldest pending request, which is the only one that can make progress.
    pub(crate) fn front(&mut self) -> Option<&mut T> {
        let id = *self.queue.front()?;
        match &mut self.slots[id as usize] {
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
            self.slots[id as usize] = SlotState::Done(bytes);
        }
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
                self.free.push(id.0);
                Ok(Some(n))
            }
        }
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
